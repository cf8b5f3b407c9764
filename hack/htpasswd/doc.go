// Command htpasswd writes the bcrypt htpasswd file of bex's in-cluster registry
// (infra/bex/registry.yaml, distribution's auth.htpasswd) for hack/install-bex.sh:
// it reads "USER PASSWORD" lines on standard input (so that no password shows in
// a process list) and writes "USER:BCRYPT" lines to standard output. Debian has
// no bcrypt in openssl, and htpasswd (apache2-utils) is not on every machine;
// golang.org/x/crypto is already bex's dependency.
package main
