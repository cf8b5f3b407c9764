package builder

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	exitCodeRE   = regexp.MustCompile(`exit code: (\d+)`)
	parseErrRE   = regexp.MustCompile(`dockerfile parse error on line (\d+): (.*)`)
	baseImageRE  = regexp.MustCompile(`failed to resolve source metadata for ([^\s:]+(?::[^\s:]+)?)`)
	solvePrefixR = regexp.MustCompile(`^(failed to solve: )+`)
)

// explain turns a failed Solve into one sentence for the pusher (plus the failing
// step's last output lines), keeping BuildKit's own words where they are clear.
func explain(ctx context.Context, err error, r *renderer) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	msg := solvePrefixR.ReplaceAllString(err.Error(), "")
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
		return fmt.Errorf("%w: buildkitd went away during the build: %s", ErrUnavailable, s.Message())
	}
	if m := parseErrRE.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("Dockerfile line %s: %s", m[1], strings.TrimSpace(m[2]))
	}
	if strings.Contains(msg, "failed to push") || strings.Contains(msg, "unexpected status from PUT") || strings.Contains(msg, "unexpected status from POST") {
		if strings.Contains(msg, "401") || strings.Contains(msg, "unauthorized") || strings.Contains(msg, "authorization") {
			return fmt.Errorf("the registry refused the push (unauthorized): check the credentials for it in the builder's registry config")
		}
		return fmt.Errorf("pushing the image failed: %s", msg)
	}
	if derr, ok := deniedSource(err, msg); ok {
		return derr
	}
	if m := baseImageRE.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("base image %s not found: check the FROM line, and that this host can pull it", m[1])
	}
	if name, verr, tail, ok := r.failedStep(); ok {
		code := "an error"
		if m := exitCodeRE.FindStringSubmatch(verr); m != nil {
			code = "exit code " + m[1]
		}
		return &stepError{step: name, code: code, tail: tail}
	}
	return fmt.Errorf("%s", msg)
}

// stepError is a build step that failed: its name, how, and its last output lines.
type stepError struct {
	step, code string
	tail       []string
}

func (e *stepError) headline() string {
	return fmt.Sprintf("step %s failed with %s", e.step, e.code)
}

func (e *stepError) Error() string {
	var b strings.Builder
	b.WriteString(e.headline())
	if len(e.tail) > 0 {
		b.WriteString("; its last output:")
		for _, l := range e.tail {
			b.WriteString("\n    " + l)
		}
	}
	return b.String()
}

// headline is err in one line, for a build's record: a failed step without its
// output, any other error up to its first line break.
func headline(err error) string {
	if se, ok := errors.AsType[*stepError](err); ok {
		return se.headline()
	}
	line, _, _ := strings.Cut(err.Error(), "\n")
	return strings.TrimSpace(line)
}
