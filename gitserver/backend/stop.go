package backend

import "errors"

// Phase is a step of a change that makes a release: where it stopped when it
// did not come to serve.
type Phase string

// The phases, in their order: the code or image fetched, the image built, the
// release recorded (its release command run), the new instances' health
// checked (they start and answer), the rollout finished.
const (
	PhaseFetch   Phase = "fetch"
	PhaseBuild   Phase = "build"
	PhaseRelease Phase = "release"
	PhaseHealth  Phase = "health"
	PhaseRollout Phase = "rollout"
)

// Stop is where a change that ran stopped without serving: its phase, whether
// it ran out of time there, and the release it made (0: none yet).
type Stop struct {
	Phase    Phase
	TimedOut bool
	Release  int64
}

// stopError is an error that says where its change stopped; its kind and
// message are the wrapped error's.
type stopError struct {
	stop Stop
	err  error
}

func (e *stopError) Error() string   { return e.err.Error() }
func (e *stopError) Unwrap() error   { return e.err }
func (e *stopError) StoppedAt() Stop { return e.stop }

// StoppedAt is err marked as a change that stopped at s: its message and kind
// stay err's. The pipeline marks its failures so, the backend its rollouts'.
func StoppedAt(err error, s Stop) error {
	if err == nil {
		return nil
	}
	return &stopError{stop: s, err: err}
}

// StopOf says where the change whose error is err stopped, when err says
// (the outermost mark); false when it does not: the change was refused, or
// failed where nothing marks it.
func StopOf(err error) (Stop, bool) {
	var s interface{ StoppedAt() Stop }
	if errors.As(err, &s) {
		return s.StoppedAt(), true
	}
	return Stop{}, false
}
