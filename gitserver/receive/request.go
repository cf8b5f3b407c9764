package receive

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/pktline"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
)

// Command is one ref update of a push. A zero Old creates the ref; a zero New deletes it.
type Command struct {
	Name plumbing.ReferenceName
	Old  plumbing.Hash
	New  plumbing.Hash
}

// IsCreate reports whether the command creates its ref.
func (c Command) IsCreate() bool { return c.Old.IsZero() && !c.New.IsZero() }

// IsDelete reports whether the command deletes its ref.
func (c Command) IsDelete() bool { return c.New.IsZero() }

// Request is what the client asked for after the ref advertisement.
type Request struct {
	Commands     []Command
	Capabilities *capability.List
	// Options are the push options (`git push -o key=value`), in order.
	Options []string
}

// HasPack reports whether a pack follows the request: git sends one unless every
// command is a deletion.
func (r *Request) HasPack() bool {
	for _, c := range r.Commands {
		if !c.IsDelete() {
			return true
		}
	}
	return false
}

// Supports reports whether the client asked for capability c.
func (r *Request) Supports(c capability.Capability) bool {
	return r.Capabilities != nil && r.Capabilities.Supports(c)
}

// ErrNoCommands means the client sent only a flush: it had nothing to push.
var ErrNoCommands = errors.New("no commands")

// MaxCommands bounds the ref updates in one push, against runaway input.
const MaxCommands = 1000

// maxPushOptions bounds the push options in one push.
const maxPushOptions = 100

// ReadRequest reads the update commands, the capabilities of the first command and,
// when the client negotiated push-options, the options. It reads exactly that much
// of r, so the pack follows. Malformed input is an error, never a panic.
func ReadRequest(r io.Reader) (*Request, error) {
	s := pktline.NewScanner(r)
	req := &Request{Capabilities: capability.NewList()}
	first := true
	for {
		if !s.Scan() {
			return nil, scanErr(s, "update commands")
		}
		line := s.Bytes()
		if len(line) == 0 { // flush-pkt
			break
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		if bytes.HasPrefix(line, []byte("shallow ")) {
			return nil, errors.New("pushes from shallow clones are not supported: push from a full clone (git fetch --unshallow)")
		}
		if first {
			first = false
			if i := bytes.IndexByte(line, 0); i >= 0 {
				if err := req.Capabilities.Decode(line[i+1:]); err != nil {
					return nil, fmt.Errorf("malformed capabilities: %w", err)
				}
				line = line[:i]
			}
		}
		cmd, err := parseCommand(line)
		if err != nil {
			return nil, err
		}
		if len(req.Commands) == MaxCommands {
			return nil, fmt.Errorf("more than %d ref updates in one push: push fewer refs at a time", MaxCommands)
		}
		req.Commands = append(req.Commands, cmd)
	}
	if len(req.Commands) == 0 {
		return nil, ErrNoCommands
	}
	if req.Supports(capability.PushOptions) {
		for {
			if !s.Scan() {
				return nil, scanErr(s, "push options")
			}
			line := s.Bytes()
			if len(line) == 0 {
				break
			}
			if len(req.Options) == maxPushOptions {
				return nil, fmt.Errorf("more than %d push options", maxPushOptions)
			}
			req.Options = append(req.Options, strings.TrimSuffix(string(line), "\n"))
		}
	}
	return req, nil
}

func scanErr(s *pktline.Scanner, what string) error {
	if err := s.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	return fmt.Errorf("reading %s: %w", what, io.ErrUnexpectedEOF)
}

// parseCommand parses "<old> <new> <ref>".
func parseCommand(b []byte) (Command, error) {
	parts := strings.SplitN(string(b), " ", 3)
	if len(parts) != 3 {
		return Command{}, fmt.Errorf("malformed update command %q", truncate(b))
	}
	old, err := parseHash(parts[0])
	if err != nil {
		return Command{}, err
	}
	nw, err := parseHash(parts[1])
	if err != nil {
		return Command{}, err
	}
	name := plumbing.ReferenceName(parts[2])
	if err := checkRefName(name); err != nil {
		return Command{}, err
	}
	if old.IsZero() && nw.IsZero() {
		return Command{}, fmt.Errorf("update of %s from zero to zero", name)
	}
	return Command{Name: name, Old: old, New: nw}, nil
}

func parseHash(s string) (plumbing.Hash, error) {
	if len(s) != 40 {
		return plumbing.ZeroHash, fmt.Errorf("malformed object id %q", truncate([]byte(s)))
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return plumbing.ZeroHash, fmt.Errorf("malformed object id %q", s)
		}
	}
	return plumbing.NewHash(s), nil
}

// checkRefName accepts the refs a push may update: branches and tags with names git
// itself would accept (git check-ref-format), nothing that could leave refs/.
func checkRefName(name plumbing.ReferenceName) error {
	s := string(name)
	if !strings.HasPrefix(s, "refs/heads/") && !strings.HasPrefix(s, "refs/tags/") {
		return fmt.Errorf("%q: only branches (refs/heads/) and tags (refs/tags/) can be pushed", truncate([]byte(s)))
	}
	if len(s) > 255 {
		return fmt.Errorf("ref name longer than 255 bytes")
	}
	for _, part := range strings.Split(s, "/") {
		if part == "" || strings.HasPrefix(part, ".") || strings.HasSuffix(part, ".lock") {
			return fmt.Errorf("%q is not a valid ref name", s)
		}
	}
	if strings.Contains(s, "..") || strings.Contains(s, "@{") || strings.HasSuffix(s, ".") {
		return fmt.Errorf("%q is not a valid ref name", s)
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || strings.ContainsRune(" ~^:?*[\\", c) {
			return fmt.Errorf("%q is not a valid ref name", s)
		}
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}
