package runtime

import (
	"regexp"
	"strconv"
)

// ExecFailure is a command a one-off could not execute, with the exit status a
// shell gives it: 127 when it is not found, 126 when it is found and cannot be
// executed. Both runtimes read it from the OCI runtime's message (runc checks
// the command before the container starts, with Go's exec.LookPath), so that
// `run APP nosuchcmd`, a release command and a cron job on an image without a
// shell exit as they would through sh, not as a failure of bex.
type ExecFailure struct {
	// Command is the command as the container was given it.
	Command string
	// Status is 127 or 126.
	Status int
	// Reason is the shell's words: "command not found", "Permission denied".
	Reason string
}

// Error is the line a shell prints, with bex in place of the shell's name.
func (e *ExecFailure) Error() string { return "bex: " + e.Command + ": " + e.Reason }

// lookPathError is exec.LookPath's error as runc reports it: exec: "NAME": why.
var lookPathError = regexp.MustCompile(`exec: ("(?:[^"\\]|\\.)*"): (executable file not found in \$PATH|permission denied|is a directory|stat [^:]*: no such file or directory)`)

// ParseExecFailure finds in msg (a runtime's error, a container status's
// message) why the command could not be executed; nil when msg says something
// else.
func ParseExecFailure(msg string) *ExecFailure {
	m := lookPathError.FindStringSubmatch(msg)
	if m == nil {
		return nil
	}
	name, err := strconv.Unquote(m[1])
	if err != nil {
		return nil
	}
	f := &ExecFailure{Command: name}
	switch why := m[2]; {
	case why == "permission denied":
		f.Status, f.Reason = 126, "Permission denied"
	case why == "is a directory":
		f.Status, f.Reason = 126, "Is a directory"
	case why == "executable file not found in $PATH":
		f.Status, f.Reason = 127, "command not found"
	default:
		f.Status, f.Reason = 127, "No such file or directory"
	}
	return f
}
