package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/bytesize"
)

// instance is one container running one process of one gen. Its mutable fields
// are guarded by Runtime.mu.
type instance struct {
	// took is what making the instance cost, step by step, for the log line
	// that says it started (and the push's profile read from it).
	took struct {
		network, container, remap, spec time.Duration
		remapped                        remapTook
		task, newTask                   time.Duration // the last start's: in all, and its NewTask (shim and runc create)
	}
	id      string
	app     types.NamespacedName
	process string
	index   int
	gen     gen
	port    int
	// addr is the instance's IP address: its own network namespace's, or
	// 127.0.0.1 on the host network. The endpoints and the health checks use it.
	addr    netip.Addr
	netns   string // the id of its network namespace; "" on the host network
	logPath string
	// restart is the process type's restart token when the instance was made
	// (runtime.Desired.Restarts); a different token wants a fresh instance.
	restart string
	ctr     containerd.Container
	// healthPath is the HTTP check of a web instance ("" = TCP connect).
	healthPath string
	// server: a type of runtime.Desired.Servers, ready once PORT accepts TCP.
	server      bool
	bootTimeout time.Duration
	// memory is the instance's memory limit in bytes, for the OOM message.
	memory int64

	ctx     context.Context // ends when the instance is stopped or the runtime closes
	cancel  context.CancelFunc
	supDone chan struct{} // closed when the supervisor returned
	gone    chan struct{} // closed when the container is deleted

	running      bool
	ready        bool
	startSeq     int       // counts task starts, so a stale prober stops
	lastStart    time.Time // of the current task
	healthFailed bool      // not ready within the boot timeout of the current task
	killedWhy    string    // why the runtime killed the current task (liveness), for its exit
	lastProbe    string    // the last health check's error
	restarts     int32
	exits        []time.Time
	lastExit     string
	// oomSeq is the startSeq of the task that a TaskOOM event was seen for.
	oomSeq int
	// lastExitOOM: the last exit was a kill by the memory limit; oomKills counts
	// them over the instance's life.
	lastExitOOM bool
	oomKills    int32
	retireAt    time.Time // set: draining, stops then
	stopNow     bool      // stop at the next reap
	stopping    bool      // being stopped
}

// name is the instance as people call it: "web.1".
func (i *instance) name() string { return fmt.Sprintf("%s.%d", i.process, i.index) }

func (i *instance) web() bool { return i.process == webProcess }

// stale reports an instance that a restart of its process type replaces.
func (i *instance) stale(d runtime.Desired) bool { return i.restart != d.Restarts[i.process] }

// leaving reports an instance on its way out: it takes no traffic and does not
// count for its gen.
func (i *instance) leaving() bool { return i.stopping || i.stopNow || !i.retireAt.IsZero() }

func (i *instance) exitsWithin(now time.Time, window time.Duration) int {
	n := 0
	for _, t := range i.exits {
		if now.Sub(t) <= window {
			n++
		}
	}
	return n
}

func (i *instance) healthFailure() string {
	what := fmt.Sprintf("accept a TCP connection on port %d", i.port)
	if i.healthPath != "" {
		what = fmt.Sprintf("answer GET %s on port %d", i.healthPath, i.port)
	}
	msg := fmt.Sprintf("%s did not %s within %v", i.name(), what, i.bootTimeout)
	if i.lastProbe != "" {
		msg += " (last try: " + i.lastProbe + ")"
	}
	return msg
}

// create makes the container of one instance and starts supervising it.
func (r *Runtime) create(ctx context.Context, a *appState, d runtime.Desired, g gen, process string, index int, img containerd.Image, env []envVar) (*instance, error) {
	began := time.Now()
	id := containerID(a.key, process, g.Release, index)
	port, err := r.store.allocate(id)
	if err != nil {
		return nil, err
	}
	inst := &instance{id: id, app: a.key, process: process, index: index, gen: g, port: port,
		bootTimeout: r.cfg.BootTimeout, restart: d.Restarts[process]}
	inst.logPath = filepath.Join(r.logDir(a.key), fmt.Sprintf("%s.%d-r%d-%s.log", process, index, g.Release, id[len(id)-6:]))
	if inst.web() && d.HealthCheck != nil {
		inst.healthPath = d.HealthCheck.Path
		if d.HealthCheck.BootTimeoutSeconds > 0 {
			inst.bootTimeout = time.Duration(d.HealthCheck.BootTimeoutSeconds) * time.Second
		}
	}
	inst.server = slices.Contains(d.Servers, process)
	if err := os.MkdirAll(filepath.Dir(inst.logPath), 0o700); err != nil {
		_ = r.store.free(port, id)
		return nil, err
	}
	links, err := r.linkPorts(ctx, a.key.Namespace, d.Env)
	if err != nil {
		_ = r.store.free(port, id)
		return nil, err
	}
	att, err := r.net.setup(ctx, id)
	if err != nil {
		_ = r.store.free(port, id)
		return nil, fmt.Errorf("network of %s: %w", id, err)
	}
	inst.addr, inst.netns = att.addr, att.id
	if err := r.net.allowLinks(ctx, att, links); err != nil {
		_ = r.net.teardown(context.WithoutCancel(ctx), att.id)
		_ = r.store.free(port, id)
		return nil, fmt.Errorf("network of %s: %w", id, err)
	}
	inst.took.network = time.Since(began)

	vars := map[string]string{}
	envList := make([]string, 0, len(env)+1)
	for _, e := range env {
		if e.name == "PORT" {
			continue // the runtime owns PORT
		}
		vars[e.name] = e.value
		envList = append(envList, e.name+"="+e.value)
	}
	vars["PORT"] = strconv.Itoa(port)
	envList = append(envList, "PORT="+strconv.Itoa(port))

	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithEnv(envList),
		// The app's instances share one containerd shim, as a pod's containers
		// do: the next release's instance starts in the shim that runs the one
		// it replaces, instead of waiting for a shim of its own to start.
		oci.WithAnnotations(map[string]string{shimGroupAnnotation: shimGroup(a.key)}),
	}
	// The instance's network namespace (or the host's), resolv.conf and hosts.
	opts = append(opts, r.net.specOpts(att)...)
	if cmd := d.Processes[process].Command; len(cmd) > 0 {
		args := make([]string, len(cmd))
		for i, c := range cmd {
			args[i] = expand(c, vars)
		}
		opts = append(opts, oci.WithProcessArgs(args...))
	}
	// The volumes the type asks for, each mounted on the host now (syncVolumes).
	vols := volumesOf(d.Volumes, process)
	if len(vols) > 0 {
		mounts, err := r.cfg.volumeMounts(a.key, vols)
		if err != nil {
			_ = r.net.teardown(context.WithoutCancel(ctx), att.id)
			_ = r.store.free(port, id)
			return nil, err
		}
		opts = append(opts, withVolumes(mounts))
	}
	// Isolation: after the image's config and the namespaces above (see security.go).
	ids, err := r.store.ids(a.key.String())
	if err != nil {
		_ = r.store.free(port, id)
		return nil, err
	}
	idm := idmap{host: ids, size: IDRangeSize}
	lim := limitsOf(d.Processes[process])
	inst.memory = lim.memory
	opts = append(opts, securityOpts(lim, idm, att.sysfs(), r.cfg.CgroupParent)...)

	labels := map[string]string{
		labelRuntime:   runtimeName,
		labelNamespace: a.key.Namespace,
		labelApp:       a.key.Name,
		labelProcess:   process,
		labelRelease:   strconv.FormatInt(g.Release, 10),
		labelConfig:    g.Config,
		labelIndex:     strconv.Itoa(index),
		labelPort:      strconv.Itoa(port),
		labelLog:       inst.logPath,
		labelBoot:      inst.bootTimeout.String(),
		labelHealth:    inst.healthPath,
		labelRestart:   inst.restart,
		labelIDs:       strconv.FormatUint(uint64(idm.host), 10),
		labelMemory:    strconv.FormatInt(lim.memory, 10),
	}
	if len(vols) > 0 {
		labels[labelVolumes] = volumeNames(vols)
	}
	if inst.server {
		labels[labelServer] = "true"
	}
	if len(links) > 0 {
		labels[labelLinks] = portsLabel(links)
	}
	if att.dir != "" {
		labels[labelAddress] = att.addr.String()
		labels[labelNetns] = att.id
	}
	madeAt := time.Now()
	ctr, err := r.cd.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithSnapshotter(r.cfg.Snapshotter),
		// The image's files owned by the app's ids: one chowned copy per image and
		// range, kept as the parent of the instances' snapshots (remap.go).
		timed(&inst.took.remap, withRemappedSnapshot(id, img, idm, &inst.took.remapped)),
		containerd.WithContainerLabels(labels),
		// The image's STOPSIGNAL, as Docker and Kubernetes honour it: Postgres's
		// SIGTERM is the "smart" shutdown, which waits for every client to go, so
		// its images ask for SIGINT (fast: clients are told, the data is
		// checkpointed). After the labels, which they would replace.
		containerd.WithImageStopSignal(img, "SIGTERM"),
		timed(&inst.took.spec, containerd.WithNewSpec(opts...)))
	if err != nil {
		_ = r.net.teardown(context.WithoutCancel(ctx), att.id)
		_ = r.store.free(port, id)
		return nil, fmt.Errorf("create container %s: %w", id, err)
	}
	inst.ctr = ctr
	inst.took.container = time.Since(madeAt)
	r.mu.Lock()
	a.instances[id] = inst
	r.mu.Unlock()
	r.supervise(inst, nil)
	return inst, nil
}

// instanceFromLabels rebuilds an adopted container's instance.
func instanceFromLabels(ctr containerd.Container, l map[string]string, cfg Config) (*instance, error) {
	inst := &instance{id: ctr.ID(), ctr: ctr, process: l[labelProcess], logPath: l[labelLog], healthPath: l[labelHealth], restart: l[labelRestart], server: l[labelServer] == "true",
		app: types.NamespacedName{Namespace: l[labelNamespace], Name: l[labelApp]}}
	var err error
	var errs []error
	if inst.gen.Release, err = strconv.ParseInt(l[labelRelease], 10, 64); err != nil {
		errs = append(errs, fmt.Errorf("release: %w", err))
	}
	inst.gen.Config = l[labelConfig]
	if inst.index, err = strconv.Atoi(l[labelIndex]); err != nil {
		errs = append(errs, fmt.Errorf("index: %w", err))
	}
	if inst.port, err = strconv.Atoi(l[labelPort]); err != nil {
		errs = append(errs, fmt.Errorf("port: %w", err))
	}
	inst.addr = loopback // made before instances had namespaces of their own
	inst.netns = l[labelNetns]
	if a, ok := l[labelAddress]; ok {
		if inst.addr, err = netip.ParseAddr(a); err != nil {
			errs = append(errs, fmt.Errorf("address: %w", err))
		}
	}
	if inst.bootTimeout, err = time.ParseDuration(l[labelBoot]); err != nil {
		inst.bootTimeout = cfg.BootTimeout
	}
	if n, err := strconv.Atoi(l[labelRestarts]); err == nil {
		inst.restarts = int32(n)
	}
	if n, err := strconv.ParseInt(l[labelMemory], 10, 64); err == nil {
		inst.memory = n
	}
	if inst.app.Name == "" || inst.app.Namespace == "" || inst.process == "" || inst.logPath == "" {
		errs = append(errs, errors.New("app, namespace, process or log missing"))
	}
	return inst, errors.Join(errs...)
}

// supervise starts the goroutine that keeps inst running: it (re)starts the task,
// waits for it to exit and restarts it with exponential backoff, counting exits for
// the crash-loop check. task is an adopted task, or nil to create one.
func (r *Runtime) supervise(inst *instance, task containerd.Task) {
	inst.ctx, inst.cancel = context.WithCancel(r.ctx)
	inst.supDone = make(chan struct{})
	inst.gone = make(chan struct{})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(inst.supDone)
		r.superviseLoop(inst, task)
	}()
}

func (r *Runtime) superviseLoop(inst *instance, task containerd.Task) {
	ctx := inst.ctx
	log := r.log.With("app", inst.app.String(), "release", inst.gen.Release, "instance", inst.name())
	backoff := r.cfg.RestartBackoff
	first := true
	for {
		var statusC <-chan containerd.ExitStatus
		var err error
		if task != nil {
			// Adopted: a running (or paused, see adopt) task is watched; any other
			// state is replaced.
			if st, serr := task.Status(ctx); serr == nil && (st.Status == containerd.Running || st.Status == containerd.Paused) {
				statusC, err = task.Wait(ctx)
			} else {
				task = nil
			}
		}
		if task == nil {
			began := time.Now()
			task, statusC, err = r.runTask(ctx, inst)
			r.mu.Lock()
			inst.took.task = time.Since(began)
			r.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			if err == nil && !first {
				r.mu.Lock()
				inst.restarts++
				n := inst.restarts
				r.mu.Unlock()
				// Kept on the container, so an adopting bex continues the count.
				_, _ = inst.ctr.SetLabels(ctx, map[string]string{labelRestarts: strconv.Itoa(int(n))})
			}
		}
		first = false
		if err == nil {
			r.mu.Lock()
			inst.running = true
			inst.ready = false
			inst.healthFailed = false
			inst.lastStart = time.Now()
			inst.startSeq++
			seq := inst.startSeq
			r.mu.Unlock()
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.probe(inst, seq)
			}()
			var st containerd.ExitStatus
			select {
			case st = <-statusC:
			case <-ctx.Done():
				return
			}
			code, _, _ := st.Result()
			err = fmt.Errorf("exited with code %d", code)
			if code > 128 {
				err = fmt.Errorf("exited with code %d (signal %d)", code, code-128)
			}
			oom := r.oomKilled(ctx, inst, seqOf(r, inst))
			r.mu.Lock()
			if inst.killedWhy != "" {
				err = errors.New(inst.killedWhy)
				inst.killedWhy = ""
			}
			inst.lastExitOOM = oom
			if oom {
				inst.oomKills++
				err = fmt.Errorf("ran out of memory (limit %s) and was killed (%s)", bytesize.Format(inst.memory), appv1.OOMKilledReason)
			}
			r.mu.Unlock()
		} else {
			r.mu.Lock()
			inst.lastExitOOM = false
			r.mu.Unlock()
		}
		r.mu.Lock()
		if inst.stopping {
			r.mu.Unlock()
			return
		}
		wasReady := inst.ready
		ranFor := time.Since(inst.lastStart)
		inst.running, inst.ready = false, false
		now := time.Now()
		inst.exits = append(inst.exits, now)
		if len(inst.exits) > 32 {
			inst.exits = inst.exits[len(inst.exits)-32:]
		}
		inst.lastExit = err.Error()
		r.mu.Unlock()
		log.Warn("instance exited; restarting", "err", err, "backoff", backoff)
		r.notify(inst.app)
		if wasReady && inst.web() {
			// Out of the endpoints at once, not at the next Sync.
			if a := r.existingApp(inst.app); a != nil {
				if perr := r.publish(ctx, a); perr != nil {
					log.Warn("update endpoints", "err", perr)
				}
			}
		}
		if ranFor > r.cfg.CrashLoopWindow {
			backoff = r.cfg.RestartBackoff
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, r.cfg.RestartBackoffMax)
		task = nil
	}
}

func (r *Runtime) existingApp(key types.NamespacedName) *appState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.apps[key]
}

// runTask replaces any task of the container with a new one and starts it; the
// process's stdout and stderr go to the instance's log file.
func (r *Runtime) runTask(ctx context.Context, inst *instance) (containerd.Task, <-chan containerd.ExitStatus, error) {
	if old, err := inst.ctr.Task(ctx, nil); err == nil {
		if _, err := old.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return nil, nil, fmt.Errorf("delete old task: %w", err)
		}
	}
	// The shim opens the log with a mode of its own (0644): made first, 0600, it
	// keeps that mode, since what an app prints is its own.
	if f, err := os.OpenFile(inst.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
		_ = f.Chmod(0o600)
		f.Close()
	}
	// Not while a backup or restore of one of its volumes has the app paused:
	// it waits for it to end (holdVolumesForStart), and one that begins after
	// finds the task running and pauses it too.
	l, err := inst.ctr.Labels(ctx)
	if err != nil {
		return nil, nil, err
	}
	unlock, err := r.cfg.holdVolumesForStart(ctx, inst.app, volumesOfLabels(l), inst.id, r.log)
	if err != nil {
		r.noteLog(inst, "bex: cannot start: "+err.Error())
		return nil, nil, fmt.Errorf("cannot start: %w", err)
	}
	defer unlock()
	made := time.Now()
	task, err := inst.ctr.NewTask(ctx, cio.LogFile(inst.logPath))
	if err != nil {
		r.noteLog(inst, "bex: cannot start: "+err.Error())
		return nil, nil, fmt.Errorf("cannot start: %w", err)
	}
	r.mu.Lock()
	inst.took.newTask = time.Since(made)
	r.mu.Unlock()
	statusC, err := task.Wait(ctx)
	if err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		return nil, nil, err
	}
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		r.noteLog(inst, "bex: cannot start: "+err.Error())
		return nil, nil, fmt.Errorf("cannot start: %w", err)
	}
	return task, statusC, nil
}

// noteLog appends a line of the runtime's own to the instance's log, so that a
// command that cannot even start says why in `logs`.
func (r *Runtime) noteLog(inst *instance, line string) {
	f, err := os.OpenFile(inst.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

var probeClient = &http.Client{
	Timeout:       2 * time.Second,
	Transport:     &http.Transport{DisableKeepAlives: true, Proxy: nil},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// check is one health check of inst.
func check(ctx context.Context, inst *instance) error {
	addr := net.JoinHostPort(inst.addr.String(), strconv.Itoa(inst.port))
	if inst.healthPath == "" {
		conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+inst.healthPath, nil)
	if err != nil {
		return err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP %s", resp.Status)
	}
	return nil
}

// probe checks a started task until it is ready. Other instances than web and
// servers (runtime.Desired.Servers) are ready once running. Checks start fast and slow down, so a quick app is noticed within
// milliseconds and a slow one is not hammered.
func (r *Runtime) probe(inst *instance, seq int) {
	log := r.log.With("app", inst.app.String(), "release", inst.gen.Release, "instance", inst.name())
	interval := 5 * time.Millisecond
	var pausedUntil time.Time // the boot timeout counts from the end of a pause
	began := time.Now()
	checks := 0
	for {
		r.mu.Lock()
		current := inst.startSeq == seq && inst.running && !inst.stopping
		deadline := inst.lastStart.Add(inst.bootTimeout)
		r.mu.Unlock()
		if pausedUntil.After(deadline) {
			deadline = pausedUntil
		}
		if !current || inst.ctx.Err() != nil {
			return
		}
		var err error
		if inst.web() || inst.server {
			err = check(inst.ctx, inst)
			checks++
		}
		r.mu.Lock()
		if inst.startSeq != seq || !inst.running {
			r.mu.Unlock()
			return
		}
		if err == nil {
			inst.ready = true
			inst.lastProbe = ""
			task, newTask, after := inst.took.task, inst.took.newTask, time.Since(inst.lastStart)
			r.mu.Unlock()
			log.Info("instance ready", "address", inst.addr, "port", inst.port,
				"task", task.Round(time.Millisecond), "new_task", newTask.Round(time.Millisecond), "after", after.Round(time.Millisecond), "checks", checks)
			r.net.replenish()
			if inst.web() {
				if a := r.existingApp(inst.app); a != nil {
					if perr := r.publish(inst.ctx, a); perr != nil && inst.ctx.Err() == nil {
						log.Warn("update endpoints", "err", perr)
					}
				}
			}
			r.notify(inst.app)
			if inst.web() {
				r.live(inst, seq, log)
			}
			return
		}
		inst.lastProbe = err.Error()
		late := time.Now().After(deadline) && !inst.healthFailed
		r.mu.Unlock()
		if late && r.pausedForVolume(inst) {
			pausedUntil = time.Now().Add(inst.bootTimeout)
			late = false
		}
		if late {
			r.mu.Lock()
			if inst.startSeq == seq && !inst.healthFailed {
				inst.healthFailed = true
			}
			r.mu.Unlock()
			log.Warn("instance not ready within the boot timeout", "err", err, "timeout", inst.bootTimeout)
		}
		select {
		case <-time.After(interval):
		case <-inst.ctx.Done():
			return
		}
		interval = probeInterval(interval, time.Since(began))
	}
}

// probeInterval is the wait after one that lasted last, for an instance whose
// checks began since ago. A new instance is checked every probeFast at most: a
// push waits for it, and a server that binds its port in 30 ms should not be
// seen 130 ms later. A check is a TCP connect (or one HTTP request) to an address
// inside the instance's own network namespace, so probeFastFor of them cost
// little. One that is still not up after that is checked ever more slowly, up to
// every 250 ms, so that a slow boot is not hammered.
func probeInterval(last, since time.Duration) time.Duration {
	next := min(last*2, 250*time.Millisecond)
	if since < probeFastFor {
		next = min(next, probeFast)
	}
	return next
}

const (
	probeFast    = 10 * time.Millisecond
	probeFastFor = 2 * time.Second
)

// pausedForVolume reports whether inst's task is paused (by a volume's backup or
// restore), and has it resumed should no backup or restore hold its volumes
// (watchPaused).
func (r *Runtime) pausedForVolume(inst *instance) bool {
	if !pausedTask(inst.ctx, inst.ctr) {
		return false
	}
	r.watchPaused(inst.id)
	return true
}

// live checks a ready web instance every LivenessInterval, as long as its task
// runs and it is not leaving. After LivenessFailures failed checks in a row it is
// taken out of the endpoints and its task is killed: the supervisor restarts it
// (with backoff, counted as an exit, so a release whose instances keep hanging is
// a crash loop), and probe brings it back once it answers. Checks that fail
// while the task is paused (a volume's backup or restore) are not counted.
func (r *Runtime) live(inst *instance, seq int, log *slog.Logger) {
	failures := 0
	for {
		select {
		case <-time.After(r.cfg.LivenessInterval):
		case <-inst.ctx.Done():
			return
		}
		r.mu.Lock()
		current := inst.startSeq == seq && inst.running && inst.ready && !inst.leaving()
		r.mu.Unlock()
		if !current {
			return
		}
		err := check(inst.ctx, inst)
		if err == nil {
			failures = 0
			continue
		}
		if r.pausedForVolume(inst) {
			// Frozen by a backup or restore of its volume, it cannot answer:
			// not a failure. Its checks count again from its resume.
			failures = 0
			log.Debug("health check not counted: the instance is paused for a backup or restore of its volume", "err", err)
			continue
		}
		if failures++; failures < r.cfg.LivenessFailures {
			continue
		}
		why := fmt.Sprintf("stopped answering its health check (%d checks in a row, the last: %v)", failures, err)
		r.mu.Lock()
		if inst.startSeq != seq || !inst.running || inst.leaving() {
			r.mu.Unlock()
			return
		}
		inst.ready = false
		inst.killedWhy = why
		r.mu.Unlock()
		log.Warn("instance "+why+"; restarting it", "port", inst.port)
		if a := r.existingApp(inst.app); a != nil {
			if perr := r.publish(inst.ctx, a); perr != nil && inst.ctx.Err() == nil {
				log.Warn("update endpoints", "err", perr)
			}
		}
		r.notify(inst.app)
		if task, err := inst.ctr.Task(inst.ctx, nil); err == nil {
			if err := task.Kill(inst.ctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
				log.Warn("kill an instance that stopped answering", "err", err)
			}
		}
		return
	}
}

// stop ends inst: out of the endpoints, SIGTERM (or the image's STOPSIGNAL),
// SIGKILL after StopTimeout, task
// and container (with its snapshot) deleted, port freed.
func (r *Runtime) stop(inst *instance) {
	log := r.log.With("app", inst.app.String(), "release", inst.gen.Release, "instance", inst.name())
	a := r.existingApp(inst.app)
	if a != nil {
		if err := r.publish(r.ctx, a); err != nil {
			log.Warn("update endpoints", "err", err)
		}
	}
	inst.cancel()
	<-inst.supDone
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.cfg.StopTimeout+30*time.Second)
	defer cancel()
	if task, err := inst.ctr.Task(ctx, nil); err == nil {
		if st, err := task.Status(ctx); err == nil && st.Status == containerd.Running {
			if statusC, err := task.Wait(ctx); err == nil {
				sig, err := containerd.GetStopSignal(ctx, inst.ctr, syscall.SIGTERM)
				if err != nil {
					sig = syscall.SIGTERM
				}
				_ = task.Kill(ctx, sig)
				select {
				case <-statusC:
				case <-r.ctx.Done():
					// Closing: Close does not wait out a stop timeout. The container
					// is adopted by the next Runtime on this state dir, which stops it.
					log.Info("runtime closing; the instance is left to the next start")
					return
				case <-time.After(r.cfg.StopTimeout):
					log.Info("instance ignored SIGTERM; killing it", "timeout", r.cfg.StopTimeout)
					_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
					select {
					case <-statusC:
					case <-ctx.Done():
					}
				}
			}
		}
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			log.Warn("delete task", "err", err)
		}
	}
	if err := inst.ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		log.Warn("delete container", "container", inst.id, "err", err)
	}
	if err := r.net.teardown(ctx, inst.netns); err != nil {
		log.Warn("tear down the instance's network", "container", inst.id, "err", err)
	}
	if err := r.store.free(inst.port, inst.id); err != nil {
		log.Warn("free port", "port", inst.port, "err", err)
	}
	r.mu.Lock()
	if a != nil {
		delete(a.instances, inst.id)
	}
	r.mu.Unlock()
	close(inst.gone)
	log.Info("instance stopped", "container", inst.id)
	r.notify(inst.app)
	if a != nil {
		r.pruneLogs(a)
	}
}

func seqOf(r *Runtime, inst *instance) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return inst.startSeq
}

// oomKilled reports whether the task run seq of inst, which just exited, was
// killed by its memory limit: a TaskOOM event came for it, or its cgroup counted
// an OOM kill (read before the task is deleted, which removes the cgroup).
func (r *Runtime) oomKilled(ctx context.Context, inst *instance, seq int) bool {
	r.mu.Lock()
	evented := inst.oomSeq == seq
	r.mu.Unlock()
	if evented {
		return true
	}
	spec, err := inst.ctr.Spec(ctx)
	if err != nil || spec.Linux == nil {
		return false
	}
	return oomKills(spec.Linux.CgroupsPath) > 0
}

// timed is opt, timing itself into d.
func timed(d *time.Duration, opt containerd.NewContainerOpts) containerd.NewContainerOpts {
	return func(ctx context.Context, c *containerd.Client, ctr *containers.Container) error {
		began := time.Now()
		err := opt(ctx, c, ctr)
		*d = time.Since(began)
		return err
	}
}

// shimGroupAnnotation is the annotation by which containerd's runc shim runs
// several containers in one shim process (containerd-shim-runc-v2's groupLabels).
const shimGroupAnnotation = "io.containerd.runc.v2.group"

// shimGroup is the shim group of app's instances: one per app. A shim is the
// host's process, out of the containers' reach; grouping changes what its
// instances share on the host (a process that tracks them), not what they
// can reach.
func shimGroup(app types.NamespacedName) string { return "bex-app-" + app.Namespace + "-" + app.Name }
