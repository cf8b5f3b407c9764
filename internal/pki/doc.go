// Package pki is bex's one way to make certificate authorities and the
// certificates they sign, and to write and read them as PEM files: the embedded
// API's PKI (internal/machine/controlplane), the edge's local CA, the development
// cluster's PKI (hack/clusterlocal) and the test harness's certificates.
//
// Every key is ECDSA P-256, every serial a random 127-bit number unless the
// template sets one. What a certificate says (its names, usages and validity)
// stays with its caller: the template is the caller's, this package signs it.
// Files are written through a temporary file and a rename, so that a crash never
// leaves half a certificate or key that the next start would read.
package pki
