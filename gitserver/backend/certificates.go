package backend

import "context"

// Certificates reads the edge's certificate state of an app's hosts (diagnose).
// Only the edge knows it: cmd/bex wires it to the edge's stats endpoint, as
// Traffic is.
type Certificates interface {
	// AppCertificates returns the state of the certificate of each host app
	// answers on: <app>.<base domain> first, then its custom domains. An app
	// the edge routes no host for, or an edge without HTTPS, has none.
	AppCertificates(ctx context.Context, app string) ([]CertificateState, error)
}

// CertificateState is the edge's certificate of one host of an app.
type CertificateState struct {
	Host  string `json:"host"`
	State string `json:"state" jsonschema:"valid, expiring (renewed soon), expired, or none (obtained on the host's first HTTPS request)"`
	// NotAfter (RFC 3339) and Issuer (the edge's issuer key: its local CA's,
	// or its ACME CA's directory) are empty when there is no certificate.
	NotAfter string `json:"not_after,omitempty"`
	Issuer   string `json:"issuer,omitempty"`
}
