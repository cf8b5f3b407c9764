package plan

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
)

// The limits on process types are the App API's (deployer/api/v1alpha1,
// spec.processes): checked here too, so that a bad Procfile fails the build with its
// line number rather than the deploy with a schema error.
const (
	maxProcesses       = 20
	maxProcessNameSize = 30
)

// procEntry is one process type of a Procfile, with the line it is on.
type procEntry struct {
	name, command string
	line          int
}

// ParseProcfile parses a Procfile: one `name: command` line per process type, such as
// `web: ./server`. Names are lower-case letters, digits and '-', starting with a letter
// (web, worker, release). Blank lines and lines starting with # are skipped. A name
// defined twice is an error. The result maps each name to its command line.
func ParseProcfile(data []byte) (map[string]string, error) {
	entries, err := parseProcfile(data)
	if err != nil {
		return nil, err
	}
	procs := make(map[string]string, len(entries))
	for _, e := range entries {
		procs[e.name] = e.command
	}
	return procs, nil
}

// ReadProcfile reads and parses the Procfile at the root of src, for an app that has
// its own Dockerfile: nil when there is none. Like Detect, it reads only a file of the
// tree: a Procfile that is a link leading out of it is an error.
func ReadProcfile(src fs.FS) (map[string]string, error) {
	a := &app{src: src}
	if !a.isFile("Procfile") {
		return nil, nil
	}
	data, err := a.read("Procfile")
	if err != nil {
		return nil, err
	}
	return ParseProcfile(data)
}

func parseProcfile(data []byte) ([]procEntry, error) {
	data = bytes.TrimPrefix(data, []byte("\ufeff")) // editors on Windows write a BOM
	var entries []procEntry
	seen := map[string]int{}
	for i, raw := range strings.Split(string(data), "\n") {
		n := i + 1
		line := strings.TrimSpace(strings.TrimSuffix(raw, "\r"))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, command, ok := strings.Cut(line, ":")
		name, command = strings.TrimSpace(name), strings.TrimSpace(command)
		if !ok || name == "" {
			return nil, fmt.Errorf("Procfile line %d: %q is not a process: a line is a name and a command, such as `web: ./server`", n, line)
		}
		if !validProcessName(name) {
			return nil, fmt.Errorf("Procfile line %d: %q is not a process type name: use lower-case letters, digits and '-', starting with a letter and at most %d characters (web, worker, release), as in `web: ./server`", n, name, maxProcessNameSize)
		}
		if command == "" {
			return nil, fmt.Errorf("Procfile line %d: process %q has no command: write it after the colon, as in `web: ./server`", n, name)
		}
		if first, dup := seen[name]; dup {
			return nil, fmt.Errorf("Procfile line %d: process %q is already defined on line %d: keep one of the two", n, name, first)
		}
		seen[name] = n
		entries = append(entries, procEntry{name: name, command: command, line: n})
	}
	if len(entries) > maxProcesses {
		return nil, fmt.Errorf("Procfile line %d: the Procfile defines %d process types, and an app has at most %d", entries[maxProcesses].line, len(entries), maxProcesses)
	}
	return entries, nil
}

// validProcessName is ^[a-z]([-a-z0-9]*[a-z0-9])?$ with at most 30 characters, the
// App API's rule: a process type becomes part of DNS names and Kubernetes names.
// ValidProcessName reports whether s may name a process type: lower-case letters,
// digits and '-', starting with a letter, at most 30 characters (the App API's rule).
func ValidProcessName(s string) bool { return validProcessName(s) }

func validProcessName(s string) bool {
	if len(s) == 0 || len(s) > maxProcessNameSize || s[0] < 'a' || s[0] > 'z' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// shellCommand returns command as the script of `sh -c`, with `exec` in front when it
// is one simple command. The process then replaces the shell and is PID 1, so it gets
// the SIGTERM that stops the container: a shell as PID 1 would ignore it, and the app
// would be killed without a chance to finish its requests. Assignments in front stay
// in front (`A=1 exec ./server`), and the program still gets them. A command with
// other shell syntax (pipes, lists, redirections, builtins) stays as written.
func shellCommand(command string) string {
	if strings.ContainsAny(command, ";&|<>()`\n") {
		return command
	}
	rest := command
	for {
		rest = strings.TrimLeft(rest, " \t")
		n := assignmentAt(rest)
		if n == 0 {
			break
		}
		rest = rest[n:]
	}
	first, _, _ := strings.Cut(rest, " ")
	if eq := strings.IndexByte(first, '='); rest == "" || shellBuiltins[first] || eq > 0 && validVarName(first[:eq]) {
		return command // only assignments, a builtin, or an assignment sh would reject
	}
	return command[:len(command)-len(rest)] + "exec " + rest
}

// assignmentAt returns the length of the NAME=value word at the start of s, quotes
// included, or 0 when s does not start with one.
func assignmentAt(s string) int {
	eq := strings.IndexByte(s, '=')
	if eq <= 0 || !validVarName(s[:eq]) {
		return 0
	}
	var quote byte
	for i := eq + 1; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			} else if c == '\\' && quote == '"' {
				i++
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '\\':
			i++
		case c == ' ' || c == '\t':
			return i
		}
	}
	if quote != 0 {
		return 0 // not closed: leave the command to the shell as written
	}
	return len(s)
}

// shellBuiltins are the words that `exec` cannot run: keywords and builtins with no
// program of the same name.
var shellBuiltins = map[string]bool{
	"!": true, ".": true, ":": true, "[[": true, "{": true, "alias": true, "case": true,
	"cd": true, "exec": true, "exit": true, "export": true, "for": true, "function": true,
	"if": true, "local": true, "read": true, "readonly": true, "return": true, "set": true,
	"shift": true, "source": true, "trap": true, "ulimit": true, "umask": true,
	"unset": true, "until": true, "wait": true, "while": true,
}

// escapeKubernetes writes s so that Kubernetes' expansion of a container's command
// gives s back: it reads `$(NAME)` as a variable and `$$` as `$`, so each `$` before a
// `$` or a `(` is doubled. `$PORT` stays as it is, for the shell.
func escapeKubernetes(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteByte(s[i])
		if s[i] == '$' && i+1 < len(s) && (s[i+1] == '$' || s[i+1] == '(') {
			b.WriteByte('$')
		}
	}
	return b.String()
}

// splitCommand splits command into words the way sh would, for a base with no shell,
// and writes each `$NAME` or `${NAME}` as `$(NAME)`: the reference that Kubernetes
// expands in a container's command from the container's environment. Syntax that
// only a shell can run (pipes, lists, redirections, subshells, command substitution,
// `${NAME:-default}`) is an error that names it.
func splitCommand(command string) ([]string, error) {
	var (
		words  []string
		word   strings.Builder
		inWord bool
		quote  byte // 0, '\'' or '"'
	)
	end := func() {
		if inWord {
			words = append(words, word.String())
		}
		word.Reset()
		inWord = false
	}
	for i := 0; i < len(command); i++ {
		c := command[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
				continue
			}
			word.WriteString(escapeLiteral(c))
		case c == '\\':
			if i+1 == len(command) {
				return nil, fmt.Errorf("the command ends with a lone \\")
			}
			i++
			// In double quotes a backslash escapes only $ ` " \; elsewhere it is kept.
			if quote == '"' && !strings.ContainsRune("$`\"\\", rune(command[i])) {
				word.WriteByte('\\')
			}
			word.WriteString(escapeLiteral(command[i]))
		case c == '"':
			quote ^= '"'
			inWord = true
		case c == '\'' && quote == 0:
			quote = '\''
			inWord = true
		case c == '$':
			name, n, err := variableAt(command[i:])
			if err != nil {
				return nil, err
			}
			if name == "" {
				word.WriteString(escapeLiteral('$'))
			} else {
				word.WriteString("$(" + name + ")")
				i += n - 1
			}
			inWord = true
		case c == '`':
			return nil, fmt.Errorf("it uses shell syntax (`)")
		case quote == 0 && (c == ' ' || c == '\t'):
			end()
		case quote == 0 && strings.IndexByte("|&;<>()\n", c) >= 0:
			return nil, fmt.Errorf("it uses shell syntax (%c)", c)
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("a %c quote is not closed", quote)
	}
	end()
	if len(words) == 0 {
		return nil, fmt.Errorf("it has no words")
	}
	return words, nil
}

// escapeLiteral is c as a literal character of a Kubernetes command: `$` is `$$`.
func escapeLiteral(c byte) string {
	if c == '$' {
		return "$$"
	}
	return string(c)
}

// variableAt reads the variable reference at the start of s, which starts with `$`:
// its name and length, or no name when the `$` is a literal dollar sign.
func variableAt(s string) (name string, n int, err error) {
	if len(s) < 2 {
		return "", 1, nil
	}
	switch c := s[1]; {
	case c == '(':
		return "", 0, fmt.Errorf("it uses shell syntax ($()")
	case c == '{':
		close := strings.IndexByte(s, '}')
		if close < 0 {
			return "", 0, fmt.Errorf("a ${ is not closed")
		}
		name := s[2:close]
		if !validVarName(name) {
			return "", 0, fmt.Errorf("it uses shell syntax (%s)", s[:close+1])
		}
		return name, close + 1, nil
	case c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
		n := 2
		for n < len(s) && isVarByte(s[n]) {
			n++
		}
		return s[1:n], n, nil
	case c == '$' || c == '?' || c == '!' || c == '#' || c == '@' || c == '*' || c >= '0' && c <= '9':
		return "", 0, fmt.Errorf("it uses shell syntax ($%c)", c)
	}
	return "", 1, nil
}

func validVarName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !isVarByte(c) {
			return false
		}
	}
	return true
}

func isVarByte(c byte) bool {
	return c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}
