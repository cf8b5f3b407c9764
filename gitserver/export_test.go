package gitserver

// UnauthQueued is how many connections wait for an unauthenticated slot.
func (s *Server) UnauthQueued() int {
	s.unauth.mu.Lock()
	defer s.unauth.mu.Unlock()
	return len(s.unauth.queue)
}
