// Package supervise runs long-lived child processes the way `bex up` needs them: each
// started in order and waited for until it answers a readiness check, restarted with
// exponential backoff when it dies, and stopped in the reverse order with SIGTERM,
// then SIGKILL after a grace period.
//
// Children get SIGKILL as their parent-death signal, so killing the supervisor
// (even with SIGKILL) leaves no daemon running. Each child's output goes to its own
// log file; the supervisor reports starts, exits and restarts through slog, and a
// start that fails says why with the end of the child's log.
package supervise
