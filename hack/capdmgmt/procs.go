package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cmdline is the command line of process pid, or nil when it is gone (or a
// zombie, whose command line is empty).
func cmdline(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
}

type proc struct {
	pid  int
	args []string
}

func (p proc) String() string { return fmt.Sprintf("PID %d (%s)", p.pid, strings.Join(p.args, " ")) }

// processes lists the processes (but this one) whose command line match accepts.
func processes(match func(args []string) bool) []proc {
	entries, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if args := cmdline(pid); args != nil && match(args) {
			out = append(out, proc{pid, args})
		}
	}
	return out
}

// mentions: an argument names path or a file under it.
func mentions(args []string, path string) bool {
	for _, arg := range args {
		for rest := arg; ; {
			i := strings.Index(rest, path)
			if i < 0 {
				break
			}
			rest = rest[i+len(path):]
			if rest == "" || rest[0] == '/' {
				return true
			}
		}
	}
	return false
}

// isServe: args are those of `capdmgmt serve DIR`, for any DIR.
func isServe(args []string) bool {
	return len(args) == 3 && filepath.Base(args[0]) == "capdmgmt" && args[1] == "serve"
}

// serves lists the `capdmgmt serve` processes of every DIR.
func serves() []proc { return processes(isServe) }
