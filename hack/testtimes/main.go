package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// pkgTime is one package's result and wall time, as `go test` gave them.
type pkgTime struct {
	name    string
	action  string // pass, fail, skip
	elapsed time.Duration
}

// pkgRun is what a package has printed so far: the tests' output is kept until
// the package ends, and printed for the tests that failed (or never ended).
type pkgRun struct {
	order  []string
	output map[string]*strings.Builder
	ended  map[string]string
}

// slowestTests is how many top-level tests the summary names: enough to see
// where a package's minutes go, few enough to read.
const slowestTests = 15

func main() {
	began := time.Now()
	times, tests, failed, err := run(os.Stdin, os.Stdout)
	printTimes(os.Stdout, times, time.Since(began))
	printSlowestTests(os.Stdout, tests, slowestTests)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) (times, tests []pkgTime, failed bool, err error) {
	runs := map[string]*pkgRun{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			// Not an event: the build's own errors (go vet, compile), as go test
			// prints them.
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		if ev.Action == "build-output" {
			fmt.Fprint(out, ev.Output) // a package that does not compile (go vet's or the compiler's words)
			continue
		}
		r := runs[ev.Package]
		if r == nil {
			r = &pkgRun{output: map[string]*strings.Builder{}, ended: map[string]string{}}
			runs[ev.Package] = r
		}
		if ev.Test == "" {
			switch ev.Action {
			case "output":
				if ev.Output != "PASS\n" {
					fmt.Fprint(out, ev.Output)
				}
			case "pass", "fail", "skip":
				if ev.Action == "fail" {
					failed = true
					r.printUnfinished(out)
				}
				times = append(times, pkgTime{name: ev.Package, action: ev.Action, elapsed: time.Duration(ev.Elapsed * float64(time.Second))})
				delete(runs, ev.Package)
			}
			continue
		}
		b := r.output[ev.Test]
		if b == nil {
			b = &strings.Builder{}
			r.output[ev.Test] = b
			r.order = append(r.order, ev.Test)
		}
		switch ev.Action {
		case "output":
			b.WriteString(ev.Output)
		case "pass", "fail", "skip":
			r.ended[ev.Test] = ev.Action
			if !strings.Contains(ev.Test, "/") {
				tests = append(tests, pkgTime{name: ev.Package + " " + ev.Test, action: ev.Action, elapsed: time.Duration(ev.Elapsed * float64(time.Second))})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return times, tests, failed, err
	}
	return times, tests, failed, nil
}

// printUnfinished prints, in the order they began, the output of the tests that
// failed or never ended (a panic, a timeout), as go test prints a failed package.
func (r *pkgRun) printUnfinished(out io.Writer) {
	for _, name := range r.order {
		if a := r.ended[name]; a == "pass" || a == "skip" {
			continue
		}
		fmt.Fprint(out, r.output[name].String())
	}
}

// printTimes prints each package's wall time, slowest first, and the whole run's.
func printTimes(out io.Writer, times []pkgTime, whole time.Duration) {
	if len(times) == 0 {
		return
	}
	slices.SortStableFunc(times, func(a, b pkgTime) int { return int(b.elapsed - a.elapsed) })
	fmt.Fprintf(out, "\nthe tests took %s; each package's wall time, slowest first (packages run in parallel):\n", whole.Round(time.Second))
	for _, t := range times {
		if t.action == "skip" && t.elapsed == 0 {
			continue // no test files
		}
		fmt.Fprintf(out, "%8.1fs  %-4s  %s\n", t.elapsed.Seconds(), t.action, t.name)
	}
}

// printSlowestTests prints the n slowest top-level tests of the whole run, so
// that a package's wall time can be read down to the tests that make it.
func printSlowestTests(out io.Writer, tests []pkgTime, n int) {
	if len(tests) == 0 {
		return
	}
	slices.SortStableFunc(tests, func(a, b pkgTime) int { return int(b.elapsed - a.elapsed) })
	fmt.Fprintf(out, "\nthe %d slowest tests (parallel tests overlap):\n", min(n, len(tests)))
	for _, t := range tests[:min(n, len(tests))] {
		fmt.Fprintf(out, "%8.1fs  %-4s  %s\n", t.elapsed.Seconds(), t.action, t.name)
	}
}
