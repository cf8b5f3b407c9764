package backend

import (
	"errors"
	"fmt"
)

// Kind is the sort of an error, for the front-ends that map it: an exit status
// and a line for ssh, a tool error's code for MCP, an HTTP status for webhooks.
type Kind int

// The kinds. Internal is the zero value: an error of no other kind is one.
const (
	// Internal: bex failed (the API is down, a file cannot be written). The
	// front-end logs it; the user is told it failed, not why in detail.
	Internal Kind = iota
	// NotFound: no such app, release, build, user, key or token (or none the
	// user may see).
	NotFound
	// Forbidden: the user may not do this.
	Forbidden
	// Invalid: the request is malformed, or cannot be done as asked.
	Invalid
	// Conflict: the state changed meanwhile, or another operation holds the app;
	// trying again may succeed.
	Conflict
	// Failed: a build, release or rollout ran and did not come to serve; the
	// previous release keeps serving.
	Failed
)

var kindNames = [...]string{Internal: "internal", NotFound: "not_found", Forbidden: "forbidden",
	Invalid: "invalid", Conflict: "conflict", Failed: "failed"}

// String is the kind's code: not_found, forbidden, invalid, conflict, failed or
// internal (the MCP tools' error codes, docs/commands.md).
func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "internal"
	}
	return kindNames[k]
}

// Error is an error with a Kind. Msg is one line for the user that says what
// was wrong and what to do; Err, when set, is the cause (for errors.Is/As and
// the log).
type Error struct {
	Kind Kind
	Msg  string
	Err  error
}

func (e *Error) Error() string {
	if e.Msg == "" && e.Err != nil {
		return e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches the kind sentinels (ErrNotFound, ...): errors.Is(err, ErrForbidden)
// holds for every Forbidden error.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Msg == "" && t.Err == nil && t.Kind == e.Kind
}

// Sentinels of the kinds, for errors.Is.
var (
	ErrInternal  error = &Error{Kind: Internal}
	ErrNotFound  error = &Error{Kind: NotFound}
	ErrForbidden error = &Error{Kind: Forbidden}
	ErrInvalid   error = &Error{Kind: Invalid}
	ErrConflict  error = &Error{Kind: Conflict}
	ErrFailed    error = &Error{Kind: Failed}
)

// Errorf makes an Error of kind; a %w in format becomes its cause.
func Errorf(kind Kind, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &Error{Kind: kind, Msg: err.Error(), Err: errors.Unwrap(err)}
}

// KindOf is err's Kind: the outermost *Error's, or Internal.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Internal
}

// errNoChange, returned by an update's change func, ends it without writing.
var errNoChange = errors.New("no change")
