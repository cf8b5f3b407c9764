// Command testtimes reads `go test -json` on its standard input and prints what
// `go test` prints without -json (each package's ok or FAIL line, and the output of
// the tests that failed), then each package's wall time, slowest first, so that
// every run of `make test` (and CI's `.ci/run`) ends with where its time went.
// It exits 1 when a package failed or a line was not a test event, so that the
// pipe's status does not depend on the test command's alone.
package main
