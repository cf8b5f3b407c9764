package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// One-off containers carry labelRuntime = oneOffRuntimeName, so the Runtime's
// adoption (labelRuntime == runtimeName) neither adopts nor deletes them, and
// labelOwner, the OneOffs that made them: a new OneOffs of the same owner on the
// same state dir removes what a previous one (a crashed or restarted process)
// left. Only one process per owner and state dir may run.
const (
	oneOffRuntimeName = "local-oneoff"
	labelOwner        = "app.bex.co/one-off-owner"
	labelOwnerPID     = "app.bex.co/one-off-pid"
)

// oneOffPort is PORT in a one-off's own network namespace: nothing routes to it,
// so no port is reserved (on the host network one is, from the store).
const oneOffPort = 5000

var ownerRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)

// oneOffProcessRE are the process names of one-offs (runtime.OneOff.Process).
var oneOffProcessRE = regexp.MustCompile(`^(release|postdeploy|(run|cron)\.[a-z0-9][a-z0-9-]{0,62})$`)

// OneOffs runs one-off instances on this host: containerd containers confined as
// the app's instances are (see instance.go and security.go). It implements
// runtime.OneOffs and may live in a process other than the Runtime's (the
// gitserver's): it shares the state dir (the store's lock makes uid ranges safe
// across processes), the containerd namespace and the apps' network, and keeps
// its network namespaces under <state dir>/net-oneoff/<owner>, apart from the
// Runtime's, whose cleanup at start would tear them down.
type OneOffs struct {
	cfg   Config
	owner string
	r     *Runtime // image, resolveEnv, store, net and cd; no supervision
	log   *slog.Logger
	ctx   context.Context
	wg    sync.WaitGroup
	stop  context.CancelFunc
}

var _ runtime.OneOffs = (*OneOffs)(nil)

// NewOneOffs connects to containerd and removes the one-offs a previous OneOffs
// of owner left (their containers, snapshots and network namespaces; their logs
// stay). owner names the process kind ("gitserver", "deployer"): lower-case
// letters, digits and dashes. kube reads the Secrets of valueFrom config vars.
func NewOneOffs(cfg Config, kube client.Client, owner string, log *slog.Logger) (*OneOffs, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("local one-offs: %w", err)
	}
	if !ownerRE.MatchString(owner) {
		return nil, fmt.Errorf("local one-offs: owner %q: want lower-case letters, digits and dashes", owner)
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "runtime/local/oneoffs", "owner", owner)
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("local one-offs: state dir: %w", err)
	}
	if err := cfg.limitTenants(); err != nil {
		return nil, fmt.Errorf("local one-offs: %w", err)
	}
	st, err := openStore(filepath.Join(cfg.StateDir, "state.json"), cfg.PortMin, cfg.PortMax, cfg.IDBase, cfg.IDRanges)
	if err != nil {
		return nil, fmt.Errorf("local one-offs: %w", err)
	}
	nw, err := newNetwork(cfg, log)
	if err != nil {
		return nil, fmt.Errorf("local one-offs: %w", err)
	}
	nw.dir = filepath.Join(cfg.StateDir, "net-oneoff", owner)
	nw.poolSize = 0
	if err := os.MkdirAll(nw.dir, 0o700); err != nil {
		return nil, fmt.Errorf("local one-offs: %w", err)
	}
	cd, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("local one-offs: cannot reach containerd at %s: %w", cfg.Address, err)
	}
	ctx, cancel := context.WithCancel(namespaces.WithNamespace(context.Background(), cfg.Namespace))
	r := &Runtime{cfg: cfg, cd: cd, kube: kube, log: log, store: st, net: nw, ctx: ctx, cancel: cancel}
	o := &OneOffs{cfg: cfg, owner: owner, r: r, log: log, ctx: ctx, stop: cancel}
	if err := o.removeLeftovers(); err != nil {
		cancel()
		cd.Close()
		return nil, fmt.Errorf("local one-offs: remove leftovers: %w", err)
	}
	nw.start()
	return o, nil
}

// Close ends every one-off still running (their runs return) and closes the
// containerd connection.
func (o *OneOffs) Close() error {
	o.stop()
	o.wg.Wait()
	o.r.net.close()
	return o.r.cd.Close()
}

func (o *OneOffs) removeLeftovers() error {
	ctx, cancel := context.WithTimeout(o.ctx, time.Minute)
	defer cancel()
	ctrs, err := o.r.cd.Containers(ctx, fmt.Sprintf("labels.%q==%s,labels.%q==%s", labelRuntime, oneOffRuntimeName, labelOwner, o.owner))
	if err != nil {
		return err
	}
	for _, ctr := range ctrs {
		labels, _ := ctr.Labels(ctx)
		o.log.Info("removing a one-off a previous process left", "container", ctr.ID(), "process", labels[labelProcess])
		o.remove(ctr, labels[labelNetns], labels[labelPort])
	}
	o.r.net.cleanup(ctx, nil)
	return nil
}

// remove kills and deletes ctr's task, the container with its snapshot, its
// network namespace and its port. Its log stays.
func (o *OneOffs) remove(ctr containerd.Container, netns, port string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(o.ctx), time.Minute)
	defer cancel()
	labels, _ := ctr.Labels(ctx)
	if task, err := ctr.Task(ctx, nil); err == nil {
		_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			o.log.Warn("delete one-off task", "container", ctr.ID(), "err", err)
		}
	}
	if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		o.log.Warn("delete one-off container", "container", ctr.ID(), "err", err)
	}
	if err := o.r.net.teardown(ctx, netns); err != nil {
		o.log.Warn("tear down a one-off's network", "container", ctr.ID(), "err", err)
	}
	if p, err := strconv.Atoi(port); err == nil {
		_ = o.r.store.free(p, ctr.ID())
	}
	if labels[labelNamespace] != "" && labels[labelApp] != "" {
		pruneOneOffLogs(o.r.logDir(types.NamespacedName{Namespace: labels[labelNamespace], Name: labels[labelApp]}), o.cfg.LogKeepStopped)
	}
}

// oneOffLog is the log file of a one-off: "_<process>-r<release>-<id>.log" in
// the app's log dir. The leading "_" (no process type starts with it) tells
// logProcess that the name up to "-r" is the whole process name ("run.<id>").
func (o *OneOffs) oneOffLog(key types.NamespacedName, oo runtime.OneOff) string {
	return filepath.Join(o.r.logDir(key), fmt.Sprintf("_%s-r%d-%s.log", oo.Process, oo.Release, oo.ID))
}

// prepared is a created one-off container.
type prepared struct {
	ctr     containerd.Container
	netns   string
	port    string
	logPath string
	app     types.NamespacedName
	volumes []string // the volumes it mounts
}

func (o *OneOffs) check(oo runtime.OneOff) error {
	switch {
	case oo.App == nil || oo.App.Name == "" || oo.App.Namespace == "":
		return errors.New("one-off: no app")
	case !regexp.MustCompile(`^[a-z0-9]{1,32}$`).MatchString(oo.ID):
		return fmt.Errorf("one-off: id %q: want lower-case letters and digits", oo.ID)
	case !oneOffProcessRE.MatchString(oo.Process):
		return fmt.Errorf("one-off: process %q: want release, postdeploy, run.<id> or cron.<job>", oo.Process)
	case oo.Image == "":
		return errors.New("one-off: no image")
	}
	return nil
}

// create makes the one-off's container: the app's user namespace, the
// capabilities, seccomp and cgroup limits of an instance (securityOpts), a network
// namespace of its own on the apps' network, the config vars and PORT.
func (o *OneOffs) create(ctx context.Context, oo runtime.OneOff) (*prepared, error) {
	if err := o.check(oo); err != nil {
		return nil, err
	}
	key := types.NamespacedName{Namespace: oo.App.Namespace, Name: oo.App.Name}
	img, err := o.r.image(ctx, oo.Image)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", oo.Image, err)
	}
	env, err := o.r.resolveEnv(ctx, runtime.Desired{App: oo.App, Env: oo.Env})
	if err != nil {
		return nil, err
	}
	links, err := o.r.linkPorts(ctx, key.Namespace, oo.Env)
	if err != nil {
		return nil, err
	}
	id := containerID(key, "oneoff-"+oo.ID, oo.Release, 0)
	p := &prepared{logPath: o.oneOffLog(key, oo), app: key}
	if err := os.MkdirAll(filepath.Dir(p.logPath), 0o700); err != nil {
		return nil, err
	}
	port := oneOffPort
	if o.cfg.Network == NetworkHost {
		if port, err = o.r.store.allocate(id); err != nil {
			return nil, err
		}
		p.port = strconv.Itoa(port)
	}
	fail := func(err error) (*prepared, error) {
		if p.netns != "" {
			_ = o.r.net.teardown(context.WithoutCancel(ctx), p.netns)
		}
		if p.port != "" {
			_ = o.r.store.free(port, id)
		}
		return nil, err
	}
	att, err := o.r.net.setup(ctx, id)
	if err != nil {
		return fail(fmt.Errorf("network of %s: %w", id, err))
	}
	p.netns = att.id
	if err := o.r.net.allowLinks(ctx, att, links); err != nil {
		return fail(fmt.Errorf("network of %s: %w", id, err))
	}

	envList := make([]string, 0, len(env)+2)
	vars := map[string]string{}
	for _, e := range env {
		if e.name == "PORT" {
			continue
		}
		vars[e.name] = e.value
		envList = append(envList, e.name+"="+e.value)
	}
	vars["PORT"] = strconv.Itoa(port)
	envList = append(envList, "PORT="+strconv.Itoa(port))
	opts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithEnv(envList)}
	opts = append(opts, o.r.net.specOpts(att)...)
	if len(oo.Command) > 0 {
		args := oo.Command
		if oo.Expand {
			// A release or postdeploy command, written as a process's command is:
			// expanded as an instance's (instance.go), so that it runs as the
			// Procfile wrote it.
			args = make([]string, len(oo.Command))
			for i, c := range oo.Command {
				args[i] = expand(c, vars)
			}
		}
		opts = append(opts, oci.WithProcessArgs(args...))
	}
	if oo.TTY != nil {
		term := oo.TTY.Term
		if term == "" {
			term = "xterm"
		}
		opts = append(opts, oci.WithTTY, oci.WithEnv([]string{"TERM=" + term}))
		if oo.TTY.Width > 0 && oo.TTY.Height > 0 {
			opts = append(opts, oci.WithTTYSize(int(oo.TTY.Width), int(oo.TTY.Height)))
		}
	}
	ids, err := o.r.store.ids(key.String())
	if err != nil {
		return fail(err)
	}
	idm := idmap{host: ids, size: IDRangeSize}
	// Every volume of the app, made here if the deployer has not made it yet (a
	// first push's release phase runs before its first Sync).
	vols := oo.App.Spec.Volumes
	if len(vols) > 0 {
		for _, v := range vols {
			if _, err := o.cfg.ensureVolume(key, v, ids); err != nil {
				return fail(err)
			}
		}
		mounts, err := o.cfg.volumeMounts(key, vols)
		if err != nil {
			return fail(err)
		}
		opts = append(opts, withVolumes(mounts))
		for _, v := range vols {
			p.volumes = append(p.volumes, v.Name)
		}
	}
	lim := limitsOf(appv1.ProcessSpec{Resources: oo.Resources})
	opts = append(opts, securityOpts(lim, idm, att.sysfs(), o.cfg.CgroupParent)...)
	labels := map[string]string{
		labelRuntime:      oneOffRuntimeName,
		labelOwner:        o.owner,
		labelOwnerPID:     strconv.Itoa(os.Getpid()),
		appv1.LabelOneOff: oo.ID,
		labelNamespace:    key.Namespace,
		labelApp:          key.Name,
		labelProcess:      oo.Process,
		labelRelease:      strconv.FormatInt(oo.Release, 10),
		labelLog:          p.logPath,
		labelIDs:          strconv.FormatUint(uint64(idm.host), 10),
		labelMemory:       strconv.FormatInt(lim.memory, 10),
	}
	if p.port != "" {
		labels[labelPort] = p.port
	}
	if len(vols) > 0 {
		labels[labelVolumes] = volumeNames(vols)
	}
	if att.dir != "" {
		labels[labelAddress] = att.addr.String()
		labels[labelNetns] = att.id
	}
	madeAt := time.Now()
	var remapped remapTook
	ctr, err := o.r.cd.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithSnapshotter(o.cfg.Snapshotter),
		// The image's copy for the app's ids, shared with the app's instances
		// and made by whichever comes first (remap.go).
		withRemappedSnapshot(id, img, idm, &remapped),
		containerd.WithContainerLabels(labels),
		containerd.WithNewSpec(opts...))
	if err != nil {
		return fail(fmt.Errorf("create container %s: %w", id, err))
	}
	p.ctr = ctr
	o.r.log.Info("one-off container made", "app", key.String(), "one-off", oo.ID, "took", time.Since(madeAt).Round(time.Millisecond), "remap_made", remapped.made)
	return p, nil
}

// Run implements runtime.OneOffs.
func (o *OneOffs) Run(ctx context.Context, oo runtime.OneOff) (int, error) {
	o.wg.Add(1)
	defer o.wg.Done()
	ctx, cancel := o.runContext(ctx)
	defer cancel()
	p, err := o.create(ctx, oo)
	if err != nil {
		return -1, err
	}
	defer o.remove(p.ctr, p.netns, p.port)

	logw, err := newCappedLog(p.logPath, o.cfg.LogMaxBytes)
	if err != nil {
		return -1, err
	}
	defer logw.Close()
	stdout := io.Writer(logw)
	if oo.Stdout != nil {
		stdout = io.MultiWriter(logw, ignoreErrors{oo.Stdout})
	}
	stderr := io.Writer(logw)
	if oo.Stderr != nil {
		stderr = io.MultiWriter(logw, ignoreErrors{oo.Stderr})
	}
	// Stdin goes through a pipe of ours, so that its end (EOF) can be passed on
	// with CloseIO: closing the FIFO's write end alone does not end the process's
	// stdin, which the shim holds open.
	var stdinR *io.PipeReader
	var stdinW *io.PipeWriter
	var stdin io.Reader
	if oo.Stdin != nil {
		stdinR, stdinW = io.Pipe()
		stdin = stdinR
		defer stdinR.Close()
	}
	copts := []cio.Opt{cio.WithStreams(stdin, stdout, stderr)}
	if oo.TTY != nil {
		copts = append(copts, cio.WithTerminal)
	}
	task, statusC, err := o.startTask(ctx, p, cio.NewCreator(copts...))
	if f := runtime.ParseExecFailure(errText(err)); f != nil {
		// As a shell says it (127, 126): the command is the user's mistake, not
		// a failure of the run.
		line := f.Error() + "\n"
		if oo.TTY != nil {
			line = f.Error() + "\r\n"
			stderr = stdout
		}
		_, _ = io.WriteString(stderr, line)
		return f.Status, nil
	}
	if err != nil {
		return -1, err
	}
	if oo.Stdin != nil {
		go func() {
			_, err := io.Copy(stdinW, oo.Stdin)
			_ = stdinW.CloseWithError(err)
			// The copy into the FIFO ends once our pipe is drained; then stdin closes.
			_ = task.CloseIO(ctx, containerd.WithStdinCloser)
		}()
	}
	if oo.TTY != nil && oo.TTY.Resize != nil {
		go func() {
			for {
				select {
				case ws, ok := <-oo.TTY.Resize:
					if !ok {
						return
					}
					if err := task.Resize(ctx, uint32(ws.Width), uint32(ws.Height)); err != nil && ctx.Err() == nil {
						o.log.Debug("resize a one-off's terminal", "err", err)
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	exit, err := o.wait(ctx, oo, task, statusC)
	// The output copied so far reaches the writers before Run returns.
	if io := task.IO(); io != nil {
		io.Wait()
	}
	return exit, err
}

// runContext is ctx, ended too when the OneOffs closes.
func (o *OneOffs) runContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(namespaces.WithNamespace(ctx, o.cfg.Namespace))
	stop := context.AfterFunc(o.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// wait waits for the task's exit, killing it after oo.Timeout (137) or when ctx
// ends (the session went: -1 and ctx's error).
func (o *OneOffs) wait(ctx context.Context, oo runtime.OneOff, task containerd.Task, statusC <-chan containerd.ExitStatus) (int, error) {
	var timeout <-chan time.Time
	if oo.Timeout > 0 {
		t := time.NewTimer(oo.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	kctx := context.WithoutCancel(ctx)
	select {
	case st := <-statusC:
		code, _, err := st.Result()
		if err != nil {
			return -1, err
		}
		return int(code), nil
	case <-timeout:
		_ = task.Kill(kctx, syscall.SIGKILL, containerd.WithKillAll)
		<-statusC
		return 137, nil
	case <-ctx.Done():
		_ = task.Kill(kctx, syscall.SIGKILL, containerd.WithKillAll)
		return -1, ctx.Err()
	}
}

// Start implements runtime.OneOffs. The shim writes the output to the log file
// (so that it survives this process), which is rotated at LogMaxBytes as an
// instance's is.
func (o *OneOffs) Start(ctx context.Context, oo runtime.OneOff, done func(exit int)) error {
	oo.Stdin, oo.Stdout, oo.Stderr, oo.TTY = nil, nil, nil, nil
	ctx, cancel := o.runContext(context.WithoutCancel(ctx))
	p, err := o.create(ctx, oo)
	if err != nil {
		cancel()
		return err
	}
	fail := func(err error) error {
		o.remove(p.ctr, p.netns, p.port)
		cancel()
		return err
	}
	if f, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
		f.Close()
	}
	task, statusC, err := o.startTask(ctx, p, cio.LogFile(p.logPath))
	if f := runtime.ParseExecFailure(errText(err)); f != nil {
		// It ended before it began, as a shell's command would: its log says
		// why, done gets the shell's status.
		if lf, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			_, _ = fmt.Fprintln(lf, f.Error())
			lf.Close()
		}
		_ = fail(err)
		if done != nil {
			go done(f.Status)
		}
		return nil
	}
	if err != nil {
		return fail(err)
	}
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		defer cancel()
		rotated := make(chan struct{})
		go func() {
			defer close(rotated)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					_ = rotate(p.logPath, o.cfg.LogMaxBytes)
				}
			}
		}()
		exit, err := o.wait(ctx, oo, task, statusC)
		if err != nil {
			exit = -1
		}
		cancel()
		<-rotated
		o.remove(p.ctr, p.netns, p.port)
		if done != nil {
			done(exit)
		}
	}()
	return nil
}

// startTask makes p's task with creator and starts it, not while a backup or
// restore of one of its volumes has the app paused (holdVolumesForStart).
func (o *OneOffs) startTask(ctx context.Context, p *prepared, creator cio.Creator) (containerd.Task, <-chan containerd.ExitStatus, error) {
	unlock, err := o.cfg.holdVolumesForStart(ctx, p.app, p.volumes, p.ctr.ID(), o.log)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot start: %w", err)
	}
	defer unlock()
	task, err := p.ctr.NewTask(ctx, creator)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot start: %w", err)
	}
	statusC, err := task.Wait(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := task.Start(ctx); err != nil {
		return nil, nil, fmt.Errorf("cannot start: %w", err)
	}
	return task, statusC, nil
}

// ignoreErrors keeps a failing live writer (a session that went) from stopping
// the copy to the log.
type ignoreErrors struct{ w io.Writer }

func (w ignoreErrors) Write(p []byte) (int, error) {
	_, _ = w.w.Write(p)
	return len(p), nil
}

// cappedLog is a one-off's log written by this process: at max bytes the file
// moves to <path>.1 and a new one starts, so it takes at most twice max.
type cappedLog struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	n    int64
}

func newCappedLog(path string, max int64) (*cappedLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &cappedLog{path: path, max: max, f: f, n: fi.Size()}, nil
}

func (l *cappedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return len(p), nil
	}
	if l.n+int64(len(p)) > l.max && l.n > 0 {
		l.f.Close()
		_ = os.Rename(l.path, l.path+".1")
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o600)
		if err != nil {
			l.f = nil
			return len(p), nil
		}
		l.f, l.n = f, 0
	}
	n, _ := l.f.Write(p)
	l.n += int64(n)
	return len(p), nil
}

func (l *cappedLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// errText is err's text, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
