package builder

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"time"

	bkclient "github.com/moby/buildkit/client"
	digest "github.com/opencontainers/go-digest"
)

// tailLines is how many output lines of each step are kept for an error message.
const tailLines = 12

// renderer turns SolveStatus updates into lines:
//
//	-----> [2/3] RUN go build -o /app .
//	       go: downloading example.com/x v1.0.0
//	       done in 3.2s
//	-----> [3/3] COPY --from=build /app /app CACHED
//
// Steps are printed when they start; output lines are indented under them (a header
// is repeated when output switches between steps that run in parallel). BuildKit's
// internal vertices ("[internal] load .dockerignore", metadata lookups) are hidden.
type renderer struct {
	w        io.Writer
	vertices map[digest.Digest]*vertexState
	last     digest.Digest // the step whose output was printed last
}

type vertexState struct {
	name    string
	started bool
	done    bool
	partial []byte   // output not yet ended by a newline
	tail    []string // the last output lines
	err     string
}

func newRenderer(w io.Writer) *renderer {
	return &renderer{w: w, vertices: map[digest.Digest]*vertexState{}}
}

func hidden(name string) bool {
	return strings.HasPrefix(name, "[internal]") || strings.HasPrefix(name, "[auth]")
}

func (r *renderer) vertex(d digest.Digest) *vertexState {
	v := r.vertices[d]
	if v == nil {
		v = &vertexState{}
		r.vertices[d] = v
	}
	return v
}

func (r *renderer) update(st *bkclient.SolveStatus) {
	for _, vx := range st.Vertexes {
		v := r.vertex(vx.Digest)
		v.name = vx.Name
		if hidden(vx.Name) {
			continue
		}
		if vx.Cached && !v.done {
			v.done, v.started = true, true
			fmt.Fprintf(r.w, "-----> %s CACHED\n", vx.Name)
			continue
		}
		if vx.Started != nil && !v.started {
			v.started = true
			r.last = vx.Digest
			fmt.Fprintf(r.w, "-----> %s\n", vx.Name)
		}
		if vx.Error != "" {
			v.err = vx.Error
		}
		if vx.Completed != nil && !v.done {
			v.done = true
			r.flushPartial(vx.Digest, v)
			if vx.Error == "" && vx.Started != nil {
				if d := vx.Completed.Sub(*vx.Started); d >= 100*time.Millisecond {
					fmt.Fprintf(r.w, "       done in %s\n", d.Round(100*time.Millisecond))
				}
			}
		}
	}
	for _, l := range st.Logs {
		v := r.vertex(l.Vertex)
		data := append(v.partial, l.Data...)
		for {
			i := bytes.IndexAny(data, "\r\n")
			if i < 0 {
				break
			}
			r.line(l.Vertex, v, string(data[:i]))
			data = data[i+1:]
		}
		v.partial = append([]byte(nil), data...)
	}
	for _, w := range st.Warnings {
		fmt.Fprintf(r.w, " !     warning: %s\n", bytes.TrimSpace(w.Short))
	}
}

func (r *renderer) flushPartial(d digest.Digest, v *vertexState) {
	if len(v.partial) > 0 {
		r.line(d, v, string(v.partial))
		v.partial = nil
	}
}

func (r *renderer) line(d digest.Digest, v *vertexState, line string) {
	line = strings.TrimRight(line, " \t")
	if line == "" {
		return
	}
	v.tail = append(v.tail, line)
	if len(v.tail) > tailLines {
		v.tail = v.tail[len(v.tail)-tailLines:]
	}
	if hidden(v.name) {
		return
	}
	if r.last != d && v.name != "" {
		r.last = d
		fmt.Fprintf(r.w, "-----> %s\n", v.name)
	}
	fmt.Fprintf(r.w, "       %s\n", line)
}

// failedStep returns the name, error and last output lines of the step that failed,
// if BuildKit reported one.
func (r *renderer) failedStep() (name, err string, tail []string, ok bool) {
	for d, v := range r.vertices {
		if v.err != "" && !strings.Contains(v.err, "context canceled") {
			r.flushPartial(d, v)
			return v.name, v.err, v.tail, true
		}
	}
	return "", "", nil, false
}
