package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// gen identifies what an instance runs: a release and a hash of the configuration
// that reached its container (image, commands, resolved env, health check). Two
// instances of the same gen are interchangeable; a config change without a new
// release number still gets new instances.
type gen struct {
	Release int64  `json:"release"`
	Config  string `json:"config"`
}

func (g gen) isZero() bool { return g == gen{} }

// stateFile is the JSON persisted in the state dir. It is small and rewritten whole
// (write to a temporary file, fsync, rename) on every change.
type stateFile struct {
	// Ports maps each reserved port to the container that holds it.
	Ports map[string]string `json:"ports"`
	// Serving maps "namespace/app" to the gen whose instances are in the endpoints,
	// so that a restarted bex knows which adopted instances serve.
	Serving map[string]gen `json:"serving"`
	// IDs maps "namespace/app" to the first host uid (and gid) of the app's user
	// namespace; the range is IDRangeSize long.
	IDs map[string]uint32 `json:"ids,omitempty"`
	// NextID is where the search for the next range starts: a range given up (a
	// deleted app) is not handed to another app before the others were used, so
	// files an old app left are not at once another app's.
	NextID uint32 `json:"nextID,omitempty"`
}

// IDRangeSize is the length of an app's uid and gid range: the 16-bit ids an image
// may use (0..65535), as Kubernetes gives a pod.
const IDRangeSize = 65536

// store owns the state file and the port allocations.
type store struct {
	mu       sync.Mutex
	path     string
	min, max int
	// idBase and idRanges bound the user-namespace ranges: range i starts at
	// idBase + i*IDRangeSize.
	idBase   uint32
	idRanges int
	next     int // where the next search starts: ports are not reused at once
	st       stateFile
	// bindable reports whether a port can be bound now; tests may replace it.
	bindable func(port int) bool
}

func openStore(path string, min, max int, idBase uint32, idRanges int) (*store, error) {
	// The search starts at a random place in the range: allocate checks that a port
	// can be bound, but between that check and the instance binding it, another
	// runtime on the same host (a second state dir, a test running beside) starting
	// from the same place would take the same port.
	s := &store{path: path, min: min, max: max, next: min + rand.IntN(max-min+1), bindable: portBindable,
		idBase: idBase, idRanges: idRanges,
		st: stateFile{Ports: map[string]string{}, Serving: map[string]gen{}, IDs: map[string]uint32{}}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(data, &s.st); err != nil {
			return nil, fmt.Errorf("state file %s: %w", path, err)
		}
		if s.st.Ports == nil {
			s.st.Ports = map[string]string{}
		}
		if s.st.Serving == nil {
			s.st.Serving = map[string]gen{}
		}
		if s.st.IDs == nil {
			s.st.IDs = map[string]uint32{}
		}
	}
	return s, nil
}

// portBindable tries to listen on the port on loopback. A port held on any address
// (including the wildcard) fails this bind on Linux.
func portBindable(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// save writes the state; the caller holds s.mu.
func (s *store) save() error {
	data, err := json.MarshalIndent(s.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Clean(s.path))
}

// allocate reserves a free port for the container id and persists it before
// returning, so that a crash between here and the container's creation leaks at
// most a reservation that the next start frees (no container holds it).
func (s *store) allocate(id string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return 0, err
	}
	defer unlock()
	n := s.max - s.min + 1
	for i := 0; i < n; i++ {
		p := s.min + (s.next-s.min+i)%n
		if _, taken := s.st.Ports[strconv.Itoa(p)]; taken {
			continue
		}
		if !s.bindable(p) {
			continue
		}
		s.st.Ports[strconv.Itoa(p)] = id
		s.next = p + 1
		if s.next > s.max {
			s.next = s.min
		}
		if err := s.save(); err != nil {
			delete(s.st.Ports, strconv.Itoa(p))
			return 0, fmt.Errorf("save port allocation: %w", err)
		}
		return p, nil
	}
	return 0, fmt.Errorf("no free port in %d-%d: every port is reserved or in use", s.min, s.max)
}

// reserve records that id holds port (an adopted container).
func (s *store) reserve(port int, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	if s.st.Ports[strconv.Itoa(port)] == id {
		return nil
	}
	s.st.Ports[strconv.Itoa(port)] = id
	return s.save()
}

// free releases port if id holds it.
func (s *store) free(port int, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	if s.st.Ports[strconv.Itoa(port)] != id {
		return nil
	}
	delete(s.st.Ports, strconv.Itoa(port))
	return s.save()
}

// retain frees every port whose container is not in live.
func (s *store) retain(live map[string]bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	changed := false
	for p, id := range s.st.Ports {
		if !live[id] {
			delete(s.st.Ports, p)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return s.save()
}

// owner returns the container holding port, if any.
func (s *store) owner(port int) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.st.Ports[strconv.Itoa(port)]
	return id, ok
}

// reserved returns how many ports are reserved.
func (s *store) reserved() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.st.Ports)
}

func (s *store) serving(app string) gen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Serving[app]
}

func (s *store) setServing(app string, g gen) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	if s.st.Serving[app] == g {
		return nil
	}
	if g.isZero() {
		delete(s.st.Serving, app)
	} else {
		s.st.Serving[app] = g
	}
	return s.save()
}

// knownIDs returns the first host id of app's user namespace when it has one.
func (s *store) knownIDs(app string) (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	base, ok := s.st.IDs[app]
	return base, ok
}

// ids returns the first host id of app's user namespace, allocating a free range
// (persisted before it is returned) when the app has none.
func (s *store) ids(app string) (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return 0, err
	}
	defer unlock()
	if base, ok := s.st.IDs[app]; ok {
		return base, nil
	}
	taken := make(map[uint32]bool, len(s.st.IDs))
	for _, base := range s.st.IDs {
		taken[base] = true
	}
	start := s.st.NextID
	for i := 0; i < s.idRanges; i++ {
		n := (start + uint32(i)) % uint32(s.idRanges)
		base := s.idBase + n*IDRangeSize
		if taken[base] {
			continue
		}
		s.st.IDs[app] = base
		prev := s.st.NextID
		s.st.NextID = (n + 1) % uint32(s.idRanges)
		if err := s.save(); err != nil {
			delete(s.st.IDs, app)
			s.st.NextID = prev
			return 0, fmt.Errorf("save uid range: %w", err)
		}
		return base, nil
	}
	return 0, fmt.Errorf("no free uid range: all %d ranges of %d ids from %d are given to apps", s.idRanges, IDRangeSize, s.idBase)
}

// reserveIDs records that app has the range at base (an adopted container),
// unless it has one already.
func (s *store) reserveIDs(app string, base uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	if _, ok := s.st.IDs[app]; ok {
		return nil
	}
	s.st.IDs[app] = base
	return s.save()
}

// idsOf is app's range's first id, if it has one; it allocates none.
func (s *store) idsOf(app string) (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if unlock, err := s.lockFile(); err == nil {
		defer unlock()
	}
	base, ok := s.st.IDs[app]
	return base, ok
}

// freeIDs gives up app's range (the app was deleted).
func (s *store) freeIDs(app string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	if _, ok := s.st.IDs[app]; !ok {
		return nil
	}
	delete(s.st.IDs, app)
	return s.save()
}

// lockFile takes the state file's lock (flock on <state>.lock) and re-reads the
// file, so that another process on the same state dir (the gitserver's one-offs
// allocating an app's uid range) and this one change it in turn, each on the
// other's last write. The caller holds s.mu; it calls the returned func to
// unlock.
func (s *store) lockFile() (func(), error) {
	f, err := os.OpenFile(s.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("state lock: %w", err)
	}
	unlock := func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
	if err := s.reload(); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// reload replaces the in-memory state with the file's, when there is one.
func (s *store) reload() error {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st stateFile
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("state file %s: %w", s.path, err)
	}
	if st.Ports == nil {
		st.Ports = map[string]string{}
	}
	if st.Serving == nil {
		st.Serving = map[string]gen{}
	}
	if st.IDs == nil {
		st.IDs = map[string]uint32{}
	}
	s.st = st
	return nil
}
