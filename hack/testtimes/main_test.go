package main

import (
	"strings"
	"testing"
	"time"
)

// A run of two packages as `go test -json` reports it: one passes, one has a
// passing and a failing test, and a third has no test files.
const stream = `{"Action":"start","Package":"ex/slow"}
{"Action":"run","Package":"ex/slow","Test":"TestOK"}
{"Action":"output","Package":"ex/slow","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"ex/slow","Test":"TestOK","Output":"    ok_test.go:9: quiet when it passes\n"}
{"Action":"output","Package":"ex/slow","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"ex/slow","Test":"TestOK","Elapsed":30.5}
{"Action":"run","Package":"ex/slow","Test":"TestBad"}
{"Action":"output","Package":"ex/slow","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"ex/slow","Test":"TestBad","Output":"    bad_test.go:7: the reason it failed\n"}
{"Action":"output","Package":"ex/slow","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"ex/slow","Test":"TestBad","Elapsed":0}
{"Action":"output","Package":"ex/slow","Output":"FAIL\n"}
{"Action":"output","Package":"ex/slow","Output":"FAIL\tex/slow\t42.000s\n"}
{"Action":"fail","Package":"ex/slow","Elapsed":42}
{"Action":"start","Package":"ex/fast"}
{"Action":"output","Package":"ex/fast","Output":"PASS\n"}
{"Action":"output","Package":"ex/fast","Output":"ok  \tex/fast\t3.500s\n"}
{"Action":"pass","Package":"ex/fast","Elapsed":3.5}
{"ImportPath":"ex/broken","Action":"build-output","Output":"broken.go:3:1: syntax error\n"}
{"ImportPath":"ex/broken","Action":"build-fail"}
{"Action":"output","Package":"ex/none","Output":"?   \tex/none\t[no test files]\n"}
{"Action":"skip","Package":"ex/none","Elapsed":0}
`

func TestRunPrintsWhatGoTestPrintsThenTheTimes(t *testing.T) {
	var out strings.Builder
	times, tests, failed, err := run(strings.NewReader(stream), &out)
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("a package failed, and run does not say so")
	}
	printTimes(&out, times, 45*time.Second)
	printSlowestTests(&out, tests, 1)
	got := out.String()
	for _, want := range []string{"the reason it failed", "--- FAIL: TestBad", "FAIL\tex/slow\t42.000s", "ok  \tex/fast\t3.500s",
		"broken.go:3:1: syntax error", "[no test files]", "the tests took 45s"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet when it passes") || strings.Contains(got, "=== RUN   TestOK") {
		t.Errorf("a passing test's output is printed:\n%s", got)
	}
	table := got[strings.Index(got, "the tests took"):]
	slow, fast := strings.Index(table, "42.0s  fail  ex/slow"), strings.Index(table, "3.5s  pass  ex/fast")
	if slow < 0 || fast < 0 || slow > fast {
		t.Errorf("want ex/slow (42.0s, fail) before ex/fast (3.5s):\n%s", table)
	}
	if strings.Contains(table, "ex/none") {
		t.Errorf("a package without tests is in the times:\n%s", table)
	}
	slowest := got[strings.Index(got, "the 1 slowest tests"):]
	if !strings.Contains(slowest, "30.5s  pass  ex/slow TestOK") || strings.Contains(slowest, "TestBad") {
		t.Errorf("want the one slowest test, ex/slow TestOK (30.5s), alone:\n%s", slowest)
	}
}

// A test that never ended (a timeout's panic) has its output printed when its
// package fails.
func TestRunPrintsATestThatNeverEnded(t *testing.T) {
	in := `{"Action":"run","Package":"ex/hang","Test":"TestHang"}
{"Action":"output","Package":"ex/hang","Test":"TestHang","Output":"panic: test timed out after 45m0s\n"}
{"Action":"output","Package":"ex/hang","Output":"FAIL\tex/hang\t2700.0s\n"}
{"Action":"fail","Package":"ex/hang","Elapsed":2700}
`
	var out strings.Builder
	if _, _, failed, err := run(strings.NewReader(in), &out); err != nil || !failed {
		t.Fatalf("failed %v, err %v", failed, err)
	}
	if !strings.Contains(out.String(), "panic: test timed out") {
		t.Errorf("the hung test's output is missing:\n%s", out.String())
	}
}
