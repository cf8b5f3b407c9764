package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// User is a person or an agent who may push and run commands over SSH, identified by
// their public keys alone. Users are cluster-scoped: one identity for the whole
// platform, granted apps through App.spec.members.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Role",type="string",JSONPath=".spec.role"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name: a user name is a DNS-1123 label: lower-case letters, digits and '-', at most 63 characters"
type User struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the user's role and keys.
	// +required
	Spec UserSpec `json:"spec"`
}

// UserRole is what a user may do.
// +kubebuilder:validation:Enum=admin;member
type UserRole string

// The roles.
const (
	// RoleAdmin may do everything: every app, users and keys.
	RoleAdmin UserRole = "admin"
	// RoleMember may use the apps that list them in spec.members.
	RoleMember UserRole = "member"
)

// UserSpec is a user's role and SSH keys.
type UserSpec struct {
	// role is admin or member.
	// +kubebuilder:default=member
	Role UserRole `json:"role"`

	// canCreateApps lets a member create an app by pushing to a new name; the member
	// is then listed in the new app's members. Admins always can.
	// +optional
	CanCreateApps bool `json:"canCreateApps,omitempty"`

	// keys are the user's SSH public keys.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=50
	Keys []SSHKey `json:"keys,omitempty"`
}

// SSHKey is one named public key.
type SSHKey struct {
	// name tells the key apart ("laptop", "ci").
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9_.@]*$`
	Name string `json:"name"`

	// publicKey is the key in OpenSSH authorized_keys form ("ssh-ed25519 AAAA... comment").
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:Pattern=`^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [^\n]*)?$`
	PublicKey string `json:"publicKey"`
}

// UserList is a list of Users.
//
// +kubebuilder:object:root=true
type UserList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []User `json:"items"`
}
