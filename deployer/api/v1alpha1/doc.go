// Package v1alpha1 holds bex's API: the App, the immutable Releases that record what
// an App ran, and the Users whose SSH keys may push. It is the one contract between
// people, the ssh commands, the gitserver, the deployer, the edge and AI agents, on a
// single node and on a cluster alike.
//
// The package imports only apimachinery so that every component can import it
// without cycles. Validation lives in the schema (kubebuilder markers and CEL rules),
// so that a bad object is refused by the API server itself, whoever writes it.
//
// +kubebuilder:object:generate=true
// +groupName=app.bex.co
package v1alpha1
