package local

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// logTail is how many lines of each instance's log Logs shows first.
const logTail = 100

func (r *Runtime) logDir(key types.NamespacedName) string {
	return filepath.Join(r.cfg.StateDir, "logs", key.Namespace, key.Name)
}

// rotateLogs keeps each instance's log under LogMaxBytes. The shim holds the file
// open in append mode, so the file is copied to <log>.1 and truncated in place
// (copytruncate): the shim's next write lands at the new end. Lines written between
// the copy and the truncation are lost; that is the price of not restarting
// the process.
func (r *Runtime) rotateLogs() {
	defer r.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		var paths []string
		for _, a := range r.apps {
			for _, inst := range a.instances {
				paths = append(paths, inst.logPath)
			}
		}
		r.mu.Unlock()
		for _, p := range paths {
			if err := rotate(p, r.cfg.LogMaxBytes); err != nil {
				r.log.Warn("rotate log", "path", p, "err", err)
			}
		}
	}
}

// rotate copies path to path.1 and truncates it when it is larger than max.
func rotate(path string, max int64) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() <= max {
		return nil
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(path+".1", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Truncate(path, 0)
}

// pruneLogs keeps the logs of at most LogKeepStopped instances that are gone.
func (r *Runtime) pruneLogs(a *appState) {
	r.mu.Lock()
	live := map[string]bool{}
	for _, inst := range a.instances {
		live[inst.logPath] = true
	}
	r.mu.Unlock()
	files, _ := filepath.Glob(filepath.Join(r.logDir(a.key), "*.log"))
	type f struct {
		path string
		mod  time.Time
	}
	var gone []f
	for _, p := range files {
		if live[p] || strings.HasPrefix(filepath.Base(p), "_") {
			continue // one-offs' logs are pruned by OneOffs
		}
		if fi, err := os.Stat(p); err == nil {
			gone = append(gone, f{p, fi.ModTime()})
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].mod.After(gone[j].mod) })
	for i := r.cfg.LogKeepStopped; i < len(gone); i++ {
		os.Remove(gone[i].path)
		os.Remove(gone[i].path + ".1")
	}
}

// logPrefix is how an instance's lines are shown: "web.1[r3]".
func logPrefix(path string) string {
	base := strings.TrimPrefix(strings.TrimSuffix(filepath.Base(path), ".log"), "_")
	// <process>.<index>-r<release>-<random>
	if i := strings.LastIndex(base, "-"); i > 0 {
		base = base[:i]
	}
	if i := strings.LastIndex(base, "-r"); i > 0 {
		return base[:i] + "[r" + base[i+2:] + "]"
	}
	return base
}

// logProcess is the process type of an instance's log file.
func logProcess(path string) string {
	base := filepath.Base(path)
	if strings.HasPrefix(base, "_") {
		// A one-off's: "_<process>-r<release>-<id>.log", the process "run.<id>",
		// "release", "postdeploy" or "cron.<job>" whole.
		base = strings.TrimSuffix(base[1:], ".log")
		if i := strings.LastIndex(base, "-r"); i > 0 {
			return base[:i]
		}
		return ""
	}
	if i := strings.IndexByte(base, '.'); i > 0 {
		return base[:i]
	}
	return ""
}

// tailLines returns the last n lines of path (with its rotated file before it).
func tailLines(path string, n int) []string {
	var lines []string
	for _, p := range []string{path + ".1", path} {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// Logs writes the recent log lines of every instance of app (the live ones and the
// last few that are gone), each line prefixed with its instance ("web.1[r3]: ").
// With follow it then keeps writing new lines, of new instances too, until ctx
// ends.
func (r *Runtime) Logs(ctx context.Context, app types.NamespacedName, follow bool, w io.Writer) error {
	return ReadLogs(ctx, r.cfg.StateDir, app, LogOptions{Follow: follow}, w)
}

// LogOptions select the lines ReadLogs writes.
type LogOptions struct {
	// Follow keeps writing new lines until ctx ends.
	Follow bool
	// Lines is how many recent lines of each instance come first; 0 means 100.
	Lines int
	// Process, when set, keeps the instances of that process type only.
	Process string
}

// ReadLogs is Runtime.Logs for a reader that has only the runtime's state
// directory (Config.StateDir): the log files are all it needs, so another process on
// the same machine (the gitserver's `logs` command) reads them without a Runtime.
func ReadLogs(ctx context.Context, stateDir string, app types.NamespacedName, opts LogOptions, w io.Writer) error {
	tail := opts.Lines
	if tail <= 0 {
		tail = logTail
	}
	dir := filepath.Join(stateDir, "logs", app.Namespace, app.Name)
	list := func() []string {
		files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		if opts.Process != "" {
			files = slices.DeleteFunc(files, func(p string) bool { return logProcess(p) != opts.Process })
		}
		sort.Slice(files, func(i, j int) bool {
			fi, erri := os.Stat(files[i])
			fj, errj := os.Stat(files[j])
			if erri != nil || errj != nil {
				return files[i] < files[j]
			}
			return fi.ModTime().Before(fj.ModTime())
		})
		return files
	}
	offsets := map[string]int64{}
	partial := map[string][]byte{}
	for _, p := range list() {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		// The offset is taken before reading, so a line written meanwhile is shown
		// by the follow loop rather than lost.
		offsets[p] = fi.Size()
		prefix := logPrefix(p)
		for _, l := range tailLines(p, tail) {
			if _, err := fmt.Fprintf(w, "%s: %s\n", prefix, l); err != nil {
				return err
			}
		}
	}
	if !opts.Follow {
		return nil
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, p := range list() {
			fi, err := os.Stat(p)
			if err != nil {
				continue
			}
			off := offsets[p]
			if fi.Size() < off {
				off = 0 // rotated (truncated in place)
				partial[p] = nil
			}
			if fi.Size() == off {
				continue
			}
			f, err := os.Open(p)
			if err != nil {
				continue
			}
			buf := make([]byte, fi.Size()-off)
			n, _ := f.ReadAt(buf, off)
			f.Close()
			offsets[p] = off + int64(n)
			data := append(partial[p], buf[:n]...)
			prefix := logPrefix(p)
			for {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					break
				}
				if _, err := fmt.Fprintf(w, "%s: %s\n", prefix, data[:i]); err != nil {
					return err
				}
				data = data[i+1:]
			}
			partial[p] = append([]byte(nil), data...)
		}
	}
}

// pruneOneOffLogs keeps the logs of the newest LogKeepStopped one-offs of the app
// in dir (those of runs still going are never the oldest for long).
func pruneOneOffLogs(dir string, keep int) {
	files, _ := filepath.Glob(filepath.Join(dir, "_*.log"))
	type f struct {
		path string
		mod  time.Time
	}
	var all []f
	for _, p := range files {
		if fi, err := os.Stat(p); err == nil {
			all = append(all, f{p, fi.ModTime()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mod.After(all[j].mod) })
	for i := keep; i < len(all); i++ {
		os.Remove(all[i].path)
		os.Remove(all[i].path + ".1")
	}
}
