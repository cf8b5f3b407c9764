package local

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"google.golang.org/protobuf/proto"

	"bex.co/bex/internal/bytesize"
)

// An instance killed by its memory limit is told apart from one that exited or
// was killed otherwise by two sources, either of which is enough: containerd's
// TaskOOM event (/tasks/oom, which the shim publishes from the cgroup's OOM
// notification) for the instance's container during the task's run, and, when
// the task exits, the cgroup's own count of OOM kills (memory.oom_control on
// cgroup v1, memory.events on v2: a task's cgroup is made afresh with each task,
// so the count is this run's). The exit code alone says nothing: a SIGKILL from
// anyone looks the same.

// watchOOM records TaskOOM events of this runtime's containers, and watches the
// containers a TaskPaused event names (watchPaused: a backup's pause that its
// process left), until the runtime closes, subscribing again after an error
// (containerd restarted).
func (r *Runtime) watchOOM() {
	defer r.wg.Done()
	for r.ctx.Err() == nil {
		ctx, cancel := context.WithCancel(r.ctx)
		envs, errs := r.cd.Subscribe(ctx, `topic=="/tasks/oom"`, `topic=="/tasks/paused"`)
	read:
		for {
			select {
			case env := <-envs:
				if env == nil || env.Event == nil {
					continue
				}
				if env.Topic == "/tasks/paused" {
					var ev eventstypes.TaskPaused
					if err := proto.Unmarshal(env.Event.GetValue(), &ev); err == nil && env.Namespace == r.cfg.Namespace {
						r.watchPaused(ev.ContainerID)
					}
					continue
				}
				var ev eventstypes.TaskOOM
				if err := proto.Unmarshal(env.Event.GetValue(), &ev); err != nil {
					r.log.Warn("unreadable OOM event", "err", err)
					continue
				}
				r.noteOOM(ev.ContainerID)
			case err := <-errs:
				if err != nil && r.ctx.Err() == nil {
					r.log.Warn("containerd events: subscribing again", "err", err)
				}
				break read
			case <-r.ctx.Done():
				break read
			}
		}
		cancel()
		select {
		case <-time.After(time.Second):
		case <-r.ctx.Done():
		}
	}
}

// noteOOM marks the running task of container id as OOM-killed.
func (r *Runtime) noteOOM(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.apps {
		if inst, ok := a.instances[id]; ok {
			if !inst.running {
				return // a late event of a task that exited: its cgroup's count told
			}
			inst.oomSeq = inst.startSeq
			r.log.Warn("instance ran out of memory", "app", inst.app.String(), "instance", inst.name(), "limit", bytesize.Format(inst.memory))
			return
		}
	}
}

// oomKills reads the count of OOM kills in the cgroup of the container's task
// (its OCI spec's cgroupsPath); -1 when it cannot be read.
func oomKills(cgroupsPath string) int {
	if cgroupsPath == "" || strings.Contains(cgroupsPath, ":") {
		return -1 // systemd cgroup driver paths ("slice:prefix:name") are not read here
	}
	files := []string{
		filepath.Join("/sys/fs/cgroup", cgroupsPath, "memory.events"),             // v2
		filepath.Join("/sys/fs/cgroup/memory", cgroupsPath, "memory.oom_control"), // v1
		filepath.Join("/sys/fs/cgroup/unified", cgroupsPath, "memory.events"),     // hybrid, memory on v2
	}
	for _, f := range files {
		if n := counter(f, "oom_kill"); n >= 0 {
			return n
		}
	}
	return -1
}

// counter reads the "key N" line of a cgroup file; -1 when absent.
func counter(path, key string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	return -1
}
