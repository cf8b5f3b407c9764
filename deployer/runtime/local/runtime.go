package local

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/bytesize"
)

// Labels on every container this runtime creates. They are the record that lets a
// restarted bex adopt its containers: everything needed to supervise an instance
// again is here, nothing lives only in memory.
const (
	labelRuntime   = "app.bex.co/runtime" // always runtimeName
	labelNamespace = "app.bex.co/namespace"
	labelApp       = appv1.LabelApp
	labelProcess   = appv1.LabelProcess
	labelRelease   = appv1.LabelRelease
	labelConfig    = "app.bex.co/config"
	labelIndex     = "app.bex.co/index"
	labelPort      = "app.bex.co/port"
	labelLog       = "app.bex.co/log"
	labelBoot      = "app.bex.co/boot-timeout"
	labelHealth    = "app.bex.co/health-path"
	labelRestarts  = "app.bex.co/restarts"
	labelRestart   = "app.bex.co/restart-token"
	labelIDs       = "app.bex.co/host-uid" // first host id of the user namespace
	labelMemory    = "app.bex.co/memory"   // memory limit in bytes
	labelAddress   = "app.bex.co/address"  // the instance's IP address; absent: 127.0.0.1 (host network)
	labelNetns     = "app.bex.co/netns"    // the id of the instance's network namespace (<state dir>/net/<id>)
	labelServer    = "app.bex.co/server"   // "true": a type of Desired.Servers, ready when PORT accepts TCP
	labelLinks     = "app.bex.co/links"    // the database ports the instance may reach (linkPorts), comma-separated
	runtimeName    = "local"
)

// webProcess is the process type that gets the app's route.
const webProcess = "web"

// Runtime runs apps as containerd containers on this host. It implements
// runtime.Runtime.
type Runtime struct {
	cfg   Config
	cd    *containerd.Client
	kube  client.Client
	log   *slog.Logger
	store *store
	net   *network

	// ctx lives as long as the Runtime and carries the containerd namespace; the
	// supervisors run under it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards apps and every mutable field of appState and instance.
	mu   sync.Mutex
	apps map[types.NamespacedName]*appState
	// thawing are the containers watchPaused watches.
	thawing map[string]bool

	// changes tells the reconciler which app changed between Syncs.
	changes chan types.NamespacedName

	// cron, when set (SetScheduler), runs the apps' cron jobs.
	cron *Scheduler
}

// SetScheduler makes s run the cron jobs of the apps r syncs (Desired.Cron,
// CronRuns), and report their runs in Status.Cron; r's Notifier tells when a
// run ended. Call it before the first Sync. Without one, cron jobs are not run.
func (r *Runtime) SetScheduler(s *Scheduler) {
	r.cron = s
	s.mu.Lock()
	s.notify = r.notify
	s.mu.Unlock()
}

var (
	_ runtime.Runtime  = (*Runtime)(nil)
	_ runtime.Notifier = (*Runtime)(nil)
)

// Changes implements runtime.Notifier.
func (r *Runtime) Changes() <-chan types.NamespacedName { return r.changes }

// notify says that app changed, without ever blocking: when the reader is behind,
// the change is dropped and the reconciler's requeue finds it.
func (r *Runtime) notify(app types.NamespacedName) {
	select {
	case r.changes <- app:
	default:
	}
}

// appState is what the runtime knows of one app.
type appState struct {
	key types.NamespacedName
	// syncMu makes Sync and Delete of one app take turns.
	syncMu sync.Mutex
	// pubMu makes endpoint publications of one app take turns.
	pubMu sync.Mutex

	// Guarded by Runtime.mu.
	instances map[string]*instance
	serving   gen
	owner     *metav1.OwnerReference
	failed    map[string]failure
	published string // what the endpoints were last written with
}

// failure is a release that could not come up. It is remembered so that the same
// release with the same config and scale is not retried in a tight loop; only a
// change of those retries it.
type failure struct {
	reason, message string
	processes       map[string]runtime.ProcessStatus
}

// New connects to containerd, adopts the containers a previous run left (see
// doc.go) and starts supervising them. c reads Secrets and writes Services and
// EndpointSlices; log gets the runtime's events. Close stops the supervision, not
// the containers.
func New(cfg Config, c client.Client, log *slog.Logger) (*Runtime, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	if c == nil {
		return nil, errors.New("local runtime: a Kubernetes client is required")
	}
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("local runtime: state dir: %w", err)
	}
	if err := cfg.limitTenants(); err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	st, err := openStore(filepath.Join(cfg.StateDir, "state.json"), cfg.PortMin, cfg.PortMax, cfg.IDBase, cfg.IDRanges)
	if err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	nw, err := newNetwork(cfg, log.With("component", "runtime/local"))
	if err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	cd, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("local runtime: cannot reach containerd at %s: %w", cfg.Address, err)
	}
	ctx, cancel := context.WithCancel(namespaces.WithNamespace(context.Background(), cfg.Namespace))
	r := &Runtime{cfg: cfg, cd: cd, kube: c, log: log.With("component", "runtime/local"), store: st, net: nw, changes: make(chan types.NamespacedName, 256),
		ctx: ctx, cancel: cancel, apps: map[types.NamespacedName]*appState{}}
	// Volumes first (after a reboot nothing is mounted): an adopted container's
	// task started again must find its volumes there.
	if err := cfg.mountAllVolumes(st.knownIDs); err != nil {
		log.Warn("mount volumes", "err", err)
	}
	if err := r.adopt(); err != nil {
		cancel()
		cd.Close()
		return nil, fmt.Errorf("local runtime: adopt running containers: %w", err)
	}
	r.net.start()
	r.wg.Add(2)
	go r.rotateLogs()
	go r.watchOOM()
	return r, nil
}

// Close stops supervising and closes the containerd connection. The containers keep
// running: the next Runtime on the same state dir adopts them.
func (r *Runtime) Close() error {
	r.cancel()
	r.wg.Wait()
	r.net.close()
	return r.cd.Close()
}

// app returns the state of key, creating it.
func (r *Runtime) app(key types.NamespacedName) *appState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.appLocked(key)
}

func (r *Runtime) appLocked(key types.NamespacedName) *appState {
	a := r.apps[key]
	if a == nil {
		a = &appState{key: key, instances: map[string]*instance{}, failed: map[string]failure{},
			serving: r.store.serving(key.String()), published: "<never>"}
		r.apps[key] = a
	}
	return a
}

// adopt lists the containers of this runtime and supervises them again, reserving
// their ports; ports of containers that are gone are freed.
func (r *Runtime) adopt() error {
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	ctrs, err := r.cd.Containers(ctx, fmt.Sprintf("labels.%q==%s", labelRuntime, runtimeName))
	if err != nil {
		return err
	}
	live, liveNetns := map[string]bool{}, map[string]bool{}
	for _, ctr := range ctrs {
		labels, err := ctr.Labels(ctx)
		if err != nil {
			return err
		}
		inst, err := instanceFromLabels(ctr, labels, r.cfg)
		if err != nil {
			// Not ours to guess about: leave it, say so.
			r.log.Warn("container with unreadable labels left alone", "container", ctr.ID(), "err", err)
			continue
		}
		if err := r.store.reserve(inst.port, inst.id); err != nil {
			return err
		}
		if base, err := strconv.ParseUint(labels[labelIDs], 10, 32); err == nil {
			if err := r.store.reserveIDs(inst.app.String(), uint32(base)); err != nil {
				return err
			}
		}
		live[inst.id] = true
		liveNetns[inst.netns] = true
		task, err := ctr.Task(ctx, nil)
		if err != nil {
			task = nil
		}
		running := false
		if task != nil {
			if st, err := task.Status(ctx); err == nil && (st.Status == containerd.Running || st.Status == containerd.Paused) {
				// Paused: by a volume's backup or restore, which resumes it, or
				// left so by one whose process went (watchPaused resumes it).
				running = true
				if st.Status == containerd.Paused {
					r.watchPaused(inst.id)
				}
			}
		}
		if !running {
			// Its namespace may be gone (bex up released it at stop; a reboot): a
			// new one, with a new address, before the task starts again.
			att, made, err := r.net.restore(ctx, inst.netns, inst.id)
			if err != nil {
				r.log.Warn("network of an adopted container", "container", inst.id, "err", err)
			} else if made {
				inst.addr = att.addr
				if _, err := ctr.SetLabels(ctx, map[string]string{labelAddress: att.addr.String()}); err != nil {
					r.log.Warn("record the new address of an adopted container", "container", inst.id, "err", err)
				}
				if err := r.net.allowLinks(ctx, att, portsOfLabel(labels[labelLinks])); err != nil {
					r.log.Warn("links of an adopted container", "container", inst.id, "err", err)
				}
			}
		}
		r.mu.Lock()
		a := r.appLocked(inst.app)
		a.instances[inst.id] = inst
		r.mu.Unlock()
		r.log.Info("adopted instance", "app", inst.app.String(), "release", inst.gen.Release, "instance", inst.name(), "container", inst.id, "address", inst.addr, "port", inst.port)
		r.supervise(inst, task)
	}
	r.net.cleanup(ctx, liveNetns)
	r.sweepLinks(ctx)
	return r.store.retain(live)
}

// Sync implements runtime.Runtime.
func (r *Runtime) Sync(ctx context.Context, d runtime.Desired) (runtime.Status, error) {
	st, err := r.syncProcesses(ctx, d)
	if err == nil && r.cron != nil {
		st.Cron = r.cron.Sync(d)
	}
	return st, err
}

func (r *Runtime) syncProcesses(ctx context.Context, d runtime.Desired) (st runtime.Status, err error) {
	if d.App == nil {
		return runtime.Status{}, errors.New("local runtime: Sync without an App")
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	key := d.Key()
	a := r.app(key)
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	log := r.log.With("app", key.String(), "release", d.Release)

	owner := metav1.OwnerReference{APIVersion: appv1.GroupVersion.String(), Kind: "App", Name: d.App.Name, UID: d.App.UID}
	r.mu.Lock()
	a.owner = &owner
	r.mu.Unlock()
	// A database (a Desired with servers) is published to nobody: no Service,
	// whose name its runtime key could not be either.
	if len(d.Servers) == 0 {
		if err := r.ensureService(ctx, a.key, owner); err != nil {
			return runtime.Status{}, err
		}
	}
	vols, volFailure, err := r.syncVolumes(ctx, d)
	if err != nil {
		return runtime.Status{}, fmt.Errorf("volumes: %w", err)
	}
	defer func() { st.Volumes = vols }()

	if d.Suspended {
		return r.suspend(ctx, a, log)
	}

	env, err := r.resolveEnv(ctx, d)
	if err != nil {
		return runtime.Status{}, err
	}
	g := gen{Release: d.Release, Config: configHash(d, env)}
	fk := failKey(g, d.Processes, d.Restarts)
	if volFailure != nil {
		// Not remembered as a failed release: the volume is tried again at each
		// Sync, and what serves keeps serving meanwhile.
		return r.status(a, d, g, volFailure), nil
	}

	r.mu.Lock()
	f, failed := a.failed[fk]
	r.mu.Unlock()
	if failed {
		r.stopUnserved(a, g)
		r.reap(a)
		return r.status(a, d, g, &f), nil
	}

	img, err := r.image(ctx, d.Image)
	if errdefs.IsNotFound(err) {
		f := failure{reason: appv1.ImageNotFoundReason,
			message: fmt.Sprintf("image %s is not in containerd: push again to rebuild it", d.Image)}
		log.Warn("release failed", "reason", f.reason, "err", err)
		r.mu.Lock()
		a.failed[fk] = f
		r.mu.Unlock()
		return r.status(a, d, g, &f), nil
	}
	if err != nil {
		return runtime.Status{}, fmt.Errorf("image %s: %w", d.Image, err)
	}

	if err := r.ensureInstances(ctx, a, d, g, img, env, log); err != nil {
		return runtime.Status{}, err
	}

	if f := r.assess(a, g); f != nil {
		r.mu.Lock()
		serving := a.serving == g
		if !serving {
			f.processes = r.processStatusLocked(a, d, g)
			a.failed[fk] = *f
		}
		r.mu.Unlock()
		if serving {
			log.Warn("serving release lacks an instance", "reason", f.reason, "err", f.message)
		} else {
			log.Warn("release failed", "reason", f.reason, "err", f.message)
		}
		if !serving {
			// Its instances go; the serving release and its endpoints stay.
			r.stopUnserved(a, g)
			r.reap(a)
		}
		return r.status(a, d, g, f), nil
	}

	r.retireReplaced(a, d, g)
	r.mu.Lock()
	switchNow := a.serving != g && r.allReadyLocked(a, d, g)
	r.mu.Unlock()
	if switchNow {
		if err := r.switchTo(ctx, a, g, log); err != nil {
			return runtime.Status{}, err
		}
	}
	// The status is taken before the endpoints are written: readiness only grows
	// between the two, so a status that says RolledOut never runs ahead of the
	// endpoints.
	st = r.status(a, d, g, nil)
	if err := r.publish(ctx, a); err != nil {
		return runtime.Status{}, err
	}
	r.reap(a)
	return st, nil
}

// switchTo makes g the serving gen: its ready web instances become the endpoints
// (written before the old ones are removed, so the edge always has a backend) and
// every other instance drains, then stops.
func (r *Runtime) switchTo(ctx context.Context, a *appState, g gen, log *slog.Logger) error {
	r.mu.Lock()
	old := a.serving
	a.serving = g
	r.mu.Unlock()
	if err := r.store.setServing(a.key.String(), g); err != nil {
		return fmt.Errorf("save serving release: %w", err)
	}
	if err := r.publish(ctx, a); err != nil {
		return err
	}
	r.mu.Lock()
	retireAt := time.Now().Add(r.cfg.Drain)
	var retired int
	for _, inst := range a.instances {
		if inst.gen != g && inst.retireAt.IsZero() {
			inst.retireAt = retireAt
			retired++
		}
	}
	r.mu.Unlock()
	if retired > 0 {
		// The drain ends on time even if nobody calls Sync meanwhile.
		time.AfterFunc(r.cfg.Drain, func() { r.reap(a) })
	}
	log.Info("release serves", "previous", old.Release, "draining", retired, "drain", r.cfg.Drain)
	return nil
}

// suspend empties the endpoints, then stops every instance.
func (r *Runtime) suspend(ctx context.Context, a *appState, log *slog.Logger) (runtime.Status, error) {
	r.mu.Lock()
	wasServing := !a.serving.isZero()
	a.serving = gen{}
	for _, inst := range a.instances {
		inst.stopNow = true
	}
	r.mu.Unlock()
	if err := r.store.setServing(a.key.String(), gen{}); err != nil {
		return runtime.Status{}, err
	}
	if err := r.publish(ctx, a); err != nil {
		return runtime.Status{}, err
	}
	if wasServing {
		log.Info("suspended")
	}
	r.reap(a)
	r.mu.Lock()
	defer r.mu.Unlock()
	return runtime.Status{RolledOut: len(a.instances) == 0, Processes: map[string]runtime.ProcessStatus{}}, nil
}

// ensureInstances starts the missing instances of g and retires those beyond the
// desired replicas.
func (r *Runtime) ensureInstances(ctx context.Context, a *appState, d runtime.Desired, g gen, img containerd.Image, env []envVar, log *slog.Logger) error {
	type slot struct {
		process string
		index   int
	}
	var missing []slot
	r.mu.Lock()
	have := map[slot]bool{}
	now := time.Now()
	for _, inst := range a.instances {
		if inst.gen != g || inst.leaving() {
			continue
		}
		spec, ok := d.Processes[inst.process]
		if !ok || inst.index > int(spec.Replicas) {
			// Scaled down: an instance in the endpoints drains first.
			if a.serving == g && inst.ready {
				inst.retireAt = now.Add(r.cfg.Drain)
				time.AfterFunc(r.cfg.Drain, func() { r.reap(a) })
			} else {
				inst.stopNow = true
			}
			continue
		}
		if inst.stale(d) {
			// ps:restart: a fresh instance takes the slot; this one stays until
			// that one is ready (retireReplaced), unless it serves nothing.
			if a.serving != g {
				inst.stopNow = true
			}
			continue
		}
		have[slot{inst.process, inst.index}] = true
	}
	for _, p := range slices.Sorted(maps.Keys(d.Processes)) {
		for i := 1; i <= int(d.Processes[p].Replicas); i++ {
			if !have[slot{p, i}] {
				missing = append(missing, slot{p, i})
			}
		}
	}
	r.mu.Unlock()
	for _, s := range missing {
		inst, err := r.create(ctx, a, d, g, s.process, s.index, img, env)
		if err != nil {
			return err
		}
		log.Info("instance started", "instance", inst.name(), "container", inst.id, "address", inst.addr, "port", inst.port,
			"network", inst.took.network.Round(time.Millisecond), "create", inst.took.container.Round(time.Millisecond),
			"remap", inst.took.remap.Round(time.Millisecond), "remap_made", inst.took.remapped.made, "spec", inst.took.spec.Round(time.Millisecond))
	}
	return nil
}

// retireReplaced retires each instance of g that a restart replaced, once the
// instance that took its slot is ready: drained first when it is in the
// endpoints, as in a switch between releases.
func (r *Runtime) retireReplaced(a *appState, d runtime.Desired, g gen) {
	type slot struct {
		process string
		index   int
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fresh := map[slot]bool{}
	for _, inst := range a.instances {
		if inst.gen == g && !inst.leaving() && !inst.stale(d) && inst.ready {
			fresh[slot{inst.process, inst.index}] = true
		}
	}
	now := time.Now()
	for _, inst := range a.instances {
		if inst.gen != g || inst.leaving() || !inst.stale(d) || !fresh[slot{inst.process, inst.index}] {
			continue
		}
		if a.serving == g && inst.web() && inst.ready {
			inst.retireAt = now.Add(r.cfg.Drain)
			time.AfterFunc(r.cfg.Drain, func() { r.reap(a) })
		} else {
			inst.stopNow = true
		}
	}
}

// stopUnserved stops the instances of g that are not in the endpoints.
func (r *Runtime) stopUnserved(a *appState, g gen) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, inst := range a.instances {
		if inst.gen == g && a.serving != g {
			inst.stopNow = true
		}
	}
}

// reap stops, in the background, the instances marked to stop now, those whose
// drain is over, and leftovers of gens that neither serve nor are wanted.
func (r *Runtime) reap(a *appState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		// Closed: what is left is adopted by the next Runtime on this state dir, which
		// reaps it then.
		return
	}
	now := time.Now()
	for _, inst := range a.instances {
		if inst.stopping {
			continue
		}
		if inst.stopNow || (!inst.retireAt.IsZero() && !now.Before(inst.retireAt)) {
			inst.stopping = true
			inst.ready = false
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.stop(inst)
			}()
		}
	}
}

// assess reports why g cannot come up, if it cannot: an instance crash-looping, or
// a web instance not ready within its boot timeout.
func (r *Runtime) assess(a *appState, g gen) *failure {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	var insts []*instance
	for _, inst := range a.instances {
		if inst.gen == g && !inst.leaving() {
			insts = append(insts, inst)
		}
	}
	sort.Slice(insts, func(i, j int) bool { return insts[i].name() < insts[j].name() })
	for _, inst := range insts {
		if n := inst.exitsWithin(now, r.cfg.CrashLoopWindow); n >= r.cfg.CrashLoopRestarts {
			msg := fmt.Sprintf("%s keeps exiting: %d exits within %v (last: %s)", inst.name(), n, r.cfg.CrashLoopWindow, inst.lastExit)
			reason := appv1.CrashLoopReason
			if inst.lastExitOOM {
				reason = appv1.OOMKilledReason
				msg = fmt.Sprintf("%s keeps running out of memory: %d exits within %v (last: %s); raise its limit with ps:resources %s %s --memory ...",
					inst.name(), n, r.cfg.CrashLoopWindow, inst.lastExit, inst.app.Name, inst.process)
			}
			if lines := tailLines(inst.logPath, 10); len(lines) > 0 {
				msg += "; last log lines:\n" + strings.Join(lines, "\n")
			}
			return &failure{reason: reason, message: msg}
		}
	}
	if a.serving == g {
		// A serving instance killed by its memory limit is restarted; until it
		// is ready again the app says why it lacks one.
		for _, inst := range insts {
			if inst.lastExitOOM && !inst.ready {
				return &failure{reason: appv1.OOMKilledReason, message: fmt.Sprintf(
					"%s ran out of memory (limit %s) and was killed; it is being restarted (ps:resources %s %s --memory ... raises the limit).",
					inst.name(), bytesize.Format(inst.memory), inst.app.Name, inst.process)}
			}
		}
	}
	for _, inst := range insts {
		if inst.healthFailed && !inst.ready {
			return &failure{reason: appv1.HealthCheckFailedReason, message: inst.healthFailure()}
		}
	}
	return nil
}

func (r *Runtime) allReadyLocked(a *appState, d runtime.Desired, g gen) bool {
	ready := map[string]int32{}
	for _, inst := range a.instances {
		if inst.gen == g && !inst.leaving() && !inst.stale(d) && inst.ready {
			ready[inst.process]++
		}
	}
	for p, spec := range d.Processes {
		if ready[p] < spec.Replicas {
			return false
		}
	}
	return true
}

func (r *Runtime) processStatusLocked(a *appState, d runtime.Desired, g gen) map[string]runtime.ProcessStatus {
	ps := map[string]runtime.ProcessStatus{}
	for p, spec := range d.Processes {
		ps[p] = runtime.ProcessStatus{Desired: spec.Replicas}
	}
	for _, inst := range a.instances {
		if inst.gen != g || inst.leaving() || inst.stale(d) {
			continue
		}
		s, ok := ps[inst.process]
		if !ok {
			continue
		}
		if inst.ready {
			s.Ready++
		}
		s.Restarts += inst.restarts
		s.OOMKills += inst.oomKills
		ps[inst.process] = s
	}
	return ps
}

// addressesLocked are the ready instances of g's server types.
func (r *Runtime) addressesLocked(a *appState, d runtime.Desired, g gen) map[string][]netip.AddrPort {
	var out map[string][]netip.AddrPort
	for _, inst := range a.instances {
		if inst.gen != g || inst.leaving() || inst.stale(d) || !inst.server || !inst.ready {
			continue
		}
		if out == nil {
			out = map[string][]netip.AddrPort{}
		}
		out[inst.process] = append(out[inst.process], netip.AddrPortFrom(inst.addr, uint16(inst.port)))
	}
	return out
}

// status reports a, for the desired gen g.
func (r *Runtime) status(a *appState, d runtime.Desired, g gen, f *failure) runtime.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := runtime.Status{Serving: a.serving.Release, Processes: r.processStatusLocked(a, d, g), Addresses: r.addressesLocked(a, d, g)}
	if f != nil {
		st.Failure, st.Message = f.reason, f.message
		if f.processes != nil && a.serving != g {
			st.Processes = f.processes
		}
		return st
	}
	if a.serving != g {
		return st
	}
	// Instances that are leaving (the previous release draining, a failed one
	// stopping, the replaced ones of a restart) no longer serve: they stop on their
	// own timers, and waiting for them would add the drain and stop timeouts to
	// every deploy.
	for _, inst := range a.instances {
		if !inst.leaving() && (inst.gen != g || inst.stale(d)) {
			// Another release, or an instance due for a restart, still runs and is
			// not on its way out.
			return st
		}
	}
	for _, s := range st.Processes {
		if s.Ready < s.Desired {
			return st
		}
	}
	st.RolledOut = true
	return st
}

// Delete implements runtime.Runtime: every instance of the app stops (SIGTERM,
// then SIGKILL), its ports are freed, its Service and EndpointSlices and logs go.
func (r *Runtime) Delete(ctx context.Context, key types.NamespacedName) error {
	if r.cron != nil {
		r.cron.Delete(key)
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	a := r.app(key)
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	r.mu.Lock()
	a.serving = gen{}
	var insts []*instance
	for _, inst := range a.instances {
		inst.stopNow = true
		insts = append(insts, inst)
	}
	r.mu.Unlock()
	if err := r.store.setServing(key.String(), gen{}); err != nil {
		return err
	}
	if err := r.deleteEndpoints(ctx, key); err != nil {
		return err
	}
	r.reap(a)
	for _, inst := range insts {
		select {
		case <-inst.gone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Containers this process never knew (created by another bex on the same
	// containerd and namespace): stop them too, so Delete leaves nothing.
	ctrs, err := r.cd.Containers(ctx,
		fmt.Sprintf("labels.%q==%s,labels.%q==%s,labels.%q==%s", labelRuntime, runtimeName, labelNamespace, key.Namespace, labelApp, key.Name))
	if err != nil {
		return fmt.Errorf("list containers of %s: %w", key, err)
	}
	for _, ctr := range ctrs {
		if task, err := ctr.Task(ctx, nil); err == nil {
			_, _ = task.Delete(ctx, containerd.WithProcessKill)
		}
		labels, lerr := ctr.Labels(ctx)
		if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete container %s: %w", ctr.ID(), err)
		}
		if lerr == nil {
			if err := r.net.teardown(ctx, labels[labelNetns]); err != nil {
				return fmt.Errorf("network of container %s: %w", ctr.ID(), err)
			}
			if p, err := strconv.Atoi(labels[labelPort]); err == nil {
				_ = r.store.free(p, ctr.ID())
			}
		}
	}
	if err := r.removeAllVolumes(key); err != nil {
		return fmt.Errorf("volumes of %s: %w", key, err)
	}
	r.mu.Lock()
	delete(r.apps, key)
	r.mu.Unlock()
	if base, ok := r.store.idsOf(key.String()); ok {
		if err := dropCopies(ctx, r.cd, base); err != nil {
			return fmt.Errorf("the image copies of %s: %w", key, err)
		}
	}
	if err := r.store.freeIDs(key.String()); err != nil {
		return err
	}
	if err := os.RemoveAll(r.logDir(key)); err != nil {
		return err
	}
	r.log.Info("app deleted", "app", key.String())
	return nil
}

// image finds the image in containerd. Images are named by tag when BuildKit
// stores them ("repo/app:commit") while Desired names them by digest
// ("repo/app@sha256:..."), so a digest reference that is not a name of its own is
// looked up by its manifest digest. The image is unpacked if it is not.
func (r *Runtime) image(ctx context.Context, ref string) (containerd.Image, error) {
	img, err := r.cd.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		if i := strings.LastIndex(ref, "@"); i > 0 {
			repo, dgst := ref[:i], ref[i+1:]
			list, lerr := r.cd.ImageService().List(ctx, fmt.Sprintf("target.digest==%s", dgst))
			if lerr != nil {
				return nil, lerr
			}
			sort.Slice(list, func(i, j int) bool {
				return strings.HasPrefix(list[i].Name, repo+":") && !strings.HasPrefix(list[j].Name, repo+":")
			})
			if len(list) > 0 {
				img, err = containerd.NewImage(r.cd, list[0]), nil
			}
		}
	}
	if err != nil {
		return nil, err
	}
	ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter)
	if err != nil {
		return nil, err
	}
	if !ok {
		began := time.Now()
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack: %w", err)
		}
		r.log.Info("image unpacked", "image", ref, "took", time.Since(began).Round(time.Millisecond))
	}
	return img, nil
}

// envVar is one resolved config var.
type envVar struct{ name, value string }

// resolveEnv resolves the config vars, reading Secret keys. A missing Secret or key
// is returned as an error: the reconciler retries with its backoff, and the error
// names what is missing.
func (r *Runtime) resolveEnv(ctx context.Context, d runtime.Desired) ([]envVar, error) {
	secrets := map[string]*corev1.Secret{}
	out := make([]envVar, 0, len(d.Env))
	for _, e := range d.Env {
		if e.ValueFrom == nil {
			out = append(out, envVar{e.Name, e.Value})
			continue
		}
		s := secrets[e.ValueFrom.Name]
		if s == nil {
			s = &corev1.Secret{}
			if err := r.kube.Get(ctx, types.NamespacedName{Namespace: d.App.Namespace, Name: e.ValueFrom.Name}, s); err != nil {
				return nil, fmt.Errorf("config var %s: secret %s/%s: %w", e.Name, d.App.Namespace, e.ValueFrom.Name, err)
			}
			secrets[e.ValueFrom.Name] = s
		}
		v, ok := s.Data[e.ValueFrom.Key]
		if !ok {
			return nil, fmt.Errorf("config var %s: secret %s/%s has no key %q", e.Name, d.App.Namespace, e.ValueFrom.Name, e.ValueFrom.Key)
		}
		out = append(out, envVar{e.Name, string(v)})
	}
	return out, nil
}

// configHash hashes what reaches an instance besides its release number and
// replicas: image, commands, resolved env (Secret values included, so rotating a
// Secret rolls the instances), the health check and the limits (ps:resources rolls
// the instances, as a change of a Deployment's pod template does).
func configHash(d runtime.Desired, env []envVar) string {
	cmds := map[string][]string{}
	lims := map[string]limits{}
	var vols map[string][]string
	for p, s := range d.Processes {
		cmds[p] = s.Command
		lims[p] = limitsOf(s)
		for _, v := range volumesOf(d.Volumes, p) {
			if vols == nil {
				vols = map[string][]string{}
			}
			vols[p] = append(vols[p], v.Name+"="+v.Path)
		}
	}
	envs := make([][2]string, len(env))
	for i, e := range env {
		envs[i] = [2]string{e.name, e.value}
	}
	data, _ := json.Marshal(struct {
		Image       string
		Commands    map[string][]string
		Env         [][2]string
		HealthCheck *appv1.HealthCheck
		Limits      map[string][3]int64
		// Volumes are left out when there are none, so that an app without any
		// keeps the hash it had before volumes existed (no rollout on upgrade).
		Volumes map[string][]string `json:",omitempty"`
		// Servers likewise: only databases have them.
		Servers []string `json:",omitempty"`
	}{d.Image, cmds, envs, d.HealthCheck, limitsJSON(lims), vols, d.Servers})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:6])
}

// failKey is a gen plus its scale and restarts: a failure is retried when any of
// them changes (ps:restart tries a failed release again).
func failKey(g gen, procs map[string]appv1.ProcessSpec, restarts map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%s", g.Release, g.Config)
	for _, p := range slices.Sorted(maps.Keys(procs)) {
		fmt.Fprintf(&b, "/%s=%d@%s", p, procs[p].Replicas, restarts[p])
	}
	return b.String()
}

// containerID is "<namespace>-<app>-<process>-r<release>-<n>-<random>", shortened
// at the front part when it would pass containerd's 76 characters, with runs of
// '-' collapsed (containerd allows one separator at a time).
func containerID(key types.NamespacedName, process string, release int64, index int) string {
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	tail := fmt.Sprintf("-%s-r%d-%d-%s", process, release, index, hex.EncodeToString(rnd[:]))
	head := key.Namespace + "-" + key.Name
	id := collapseDashes(head + tail)
	if len(id) > 76 {
		tail = collapseDashes(tail)
		head = collapseDashes(head)
		if keep := 76 - len(tail); keep > 0 && keep < len(head) {
			head = strings.TrimRight(head[:keep], "-")
		}
		id = collapseDashes(head + tail)
		if len(id) > 76 {
			id = strings.TrimLeft(id[len(id)-76:], "-")
		}
	}
	return id
}

func collapseDashes(s string) string {
	for strings.Contains(s, "--") {
		s = strings.ReplaceAll(s, "--", "-")
	}
	return s
}

func limitsJSON(m map[string]limits) map[string][3]int64 {
	out := make(map[string][3]int64, len(m))
	for p, l := range m {
		out[p] = [3]int64{l.memory, l.pids, l.cpuMillis}
	}
	return out
}
