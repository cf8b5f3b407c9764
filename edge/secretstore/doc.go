// Package secretstore is a certmagic.Storage on Kubernetes Secrets, so that every
// replica of the edge shares one set of certificates and ACME accounts, with locks
// on coordination.k8s.io Leases so that only one replica obtains a given
// certificate at a time.
//
// Each key is one Secret named bex-certmagic-<hash of the key>, labelled for
// listing, with the key itself in an annotation (names are DNS labels, keys are
// paths) and the value in data["value"]. A lock is a Lease that its holder renews
// while it holds it; a Lease not renewed for its duration is expired and can be
// taken over, so a replica that dies holding a lock delays the others by one lease
// duration, not forever.
package secretstore
