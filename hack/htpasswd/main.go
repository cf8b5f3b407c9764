package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "hack/htpasswd:", err)
		os.Exit(1)
	}
}

// user names distribution's htpasswd parser takes as they are (it splits each
// line at the first colon).
var user = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

func run(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	n := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		name, pass, ok := strings.Cut(line, " ")
		if !ok || !user.MatchString(name) || pass == "" {
			return fmt.Errorf("line %d: want \"USER PASSWORD\" (USER of a-z, 0-9 and -), one a line", n+1)
		}
		h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
		if err != nil {
			return fmt.Errorf("user %s: %w", name, err)
		}
		if _, err := fmt.Fprintf(out, "%s:%s\n", name, h); err != nil {
			return err
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("no \"USER PASSWORD\" line on standard input")
	}
	return nil
}
