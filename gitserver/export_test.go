package gitserver

// OnRepack calls f after each background repack attempt, with skipped when git
// did not run (the app's lock was busy, or the server stopping).
func (s *Server) OnRepack(f func(app string, skipped bool, err error)) {
	s.repack.mu.Lock()
	defer s.repack.mu.Unlock()
	s.repack.ran = func(app string, err error, skipped bool) { f(app, skipped, err) }
}

// RepackLater queues a repack of app's repository, as the end of a push does.
func (s *Server) RepackLater(app string) { s.repackLater(app) }

// WhereToLook is the end of the disk refusals, for the tests that read them.
const WhereToLook = whereToLook

// UnauthQueued is how many connections wait for an unauthenticated slot.
func (s *Server) UnauthQueued() int {
	s.unauth.mu.Lock()
	defer s.unauth.mu.Unlock()
	return len(s.unauth.queue)
}
