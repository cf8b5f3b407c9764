package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const usage = `usage: capdmgmt up DIR | down DIR | serve DIR   (hack/cluster-capd.sh runs it)`

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	dir, err := filepath.Abs(os.Args[2])
	if err == nil {
		err = run(os.Args[1], dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "capdmgmt: %v\n", err)
		os.Exit(1)
	}
}

func run(cmd, dir string) error {
	l := layout{dir: dir}
	switch cmd {
	case "up":
		return up(l)
	case "down":
		return down(l)
	case "serve":
		return serve(l)
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

// checkout is the bex repository around the working directory: bin/ holds the
// binaries, hack/versions.env the release.
func checkout() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module bex.co/bex\n") {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("run capdmgmt inside the bex checkout (hack/cluster-capd.sh does): no go.mod of bex.co/bex above " + wd)
		}
	}
}

func say(format string, args ...any) { fmt.Fprintf(os.Stderr, "==> "+format+"\n", args...) }
