package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// OneOffContainer is the name of a one-off pod's only container.
const OneOffContainer = "oneoff"

// oneOffPoll is how often a one-off pod's state is read while it starts and
// after its output ended.
const oneOffPoll = 250 * time.Millisecond

// deleteTimeout bounds the deletion of a one-off pod once its run is over.
const deleteTimeout = 30 * time.Second

// OneOffs runs one-off pods in the apps' namespaces (runtime.OneOffs), attached
// through the API server as `kubectl attach` is.
type OneOffs struct {
	cfg Config
	cs  kubernetes.Interface
	rc  *rest.Config
}

var _ runtime.OneOffs = (*OneOffs)(nil)

// NewOneOffs returns the one-off runner of the cluster rc names; cfg is the
// runtime's Config (the same pods' confinement as the Deployments').
func NewOneOffs(cfg Config, rc *rest.Config) (*OneOffs, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kube one-offs: %w", err)
	}
	if rc == nil {
		return nil, errors.New("kube one-offs: no rest config")
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube one-offs: %w", err)
	}
	return &OneOffs{cfg: cfg, cs: cs, rc: rc}, nil
}

// OneOffPodName is the name of the pod of one-off id of app.
func OneOffPodName(app, id string) string { return app + "-oneoff-" + id }

// escapeArgv makes an argv literal for Kubernetes, which expands `$(NAME)` and
// `$$` in a container's command: one-off commands are literal, as on the local
// runtime, unless OneOff.Expand says they are written as a container's command.
func escapeArgv(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = strings.ReplaceAll(a, "$", "$$")
	}
	return out
}

// oneOffContainer is the container of a one-off: the app's env and
// confinement, the command's argv, stdin and a TTY when asked for.
func oneOffContainer(cfg Config, image string, command []string, env []appv1.EnvVar, res *appv1.Resources) *corev1ac.ContainerApplyConfiguration {
	c := corev1ac.Container().
		WithName(OneOffContainer).
		WithImage(image).
		WithEnv(containerEnv(cfg, env)...).
		WithResources(resources(appv1.ProcessSpec{Resources: res})).
		WithSecurityContext(securityContext())
	if len(command) > 0 {
		c.WithCommand(command...)
	}
	return c
}

// oneOffPod is the apply configuration of o's pod.
func oneOffPod(cfg Config, o runtime.OneOff, attach bool) *corev1ac.PodApplyConfiguration {
	command := o.Command
	if !o.Expand {
		command = escapeArgv(command)
	}
	c := oneOffContainer(cfg, o.Image, command, o.Env, o.Resources)
	if attach {
		// stdinOnce: the container's stdin is closed when the attach that
		// wrote it ends, which is how the process gets its EOF.
		c.WithStdin(true).WithStdinOnce(true)
	}
	if o.TTY != nil {
		c.WithTTY(true)
		if o.TTY.Term != "" {
			c.WithEnv(corev1ac.EnvVar().WithName("TERM").WithValue(escapeEnvValue(o.TTY.Term)))
		}
	}
	// Mounts first: podSpec copies the container.
	withVolumeMounts(c, o.App.Spec.Volumes)
	spec := podSpec(cfg, c).
		WithRestartPolicy(corev1.RestartPolicyNever).
		WithTerminationGracePeriodSeconds(cfg.TerminationGracePeriodSeconds)
	if o.Timeout > 0 {
		spec.WithActiveDeadlineSeconds(int64(math.Ceil(o.Timeout.Seconds())))
	}
	withOneOffClaims(spec, o.App.Name, o.App.Spec.Volumes)
	return corev1ac.Pod(OneOffPodName(o.App.Name, o.ID), o.App.Namespace).
		WithLabels(map[string]string{
			LabelApp:          o.App.Name,
			LabelProcess:      o.Process,
			LabelRelease:      strconv.FormatInt(o.Release, 10),
			appv1.LabelOneOff: o.ID,
		}).
		WithOwnerReferences(ownerReference(o.App)).
		WithSpec(spec)
}

// withOneOffClaims gives a one-off's pod (a run, the release phase, a cron
// job's run) the claims of every volume of the app, whose container mounts
// them all, as on one machine. A claim attaches to one node at a time: the pod
// prefers the node of the app's pods, and waits (up to its timeout) when it
// lands elsewhere while they hold it.
func withOneOffClaims(spec *corev1ac.PodSpecApplyConfiguration, app string, vols []appv1.Volume) {
	if len(vols) == 0 {
		return
	}
	withVolumeClaims(spec, app, vols)
	spec.WithAffinity(corev1ac.Affinity().WithPodAffinity(corev1ac.PodAffinity().
		WithPreferredDuringSchedulingIgnoredDuringExecution(corev1ac.WeightedPodAffinityTerm().
			WithWeight(100).
			WithPodAffinityTerm(corev1ac.PodAffinityTerm().
				WithTopologyKey(corev1.LabelHostname).
				WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{LabelApp: app}))))))
}

func checkOneOff(o runtime.OneOff) error {
	if o.App == nil || o.App.Name == "" || o.App.Namespace == "" || o.App.UID == "" {
		return errors.New("kube one-off: needs the App as read from the API server (name, namespace, UID)")
	}
	if o.ID == "" || o.Process == "" || o.Image == "" {
		return fmt.Errorf("app %s/%s: one-off needs an id, a process name and an image", o.App.Namespace, o.App.Name)
	}
	return nil
}

// create applies o's pod.
func (r *OneOffs) create(ctx context.Context, o runtime.OneOff, attach bool) error {
	_, err := r.cs.CoreV1().Pods(o.App.Namespace).Apply(ctx, oneOffPod(r.cfg, o, attach),
		metav1.ApplyOptions{FieldManager: r.cfg.FieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("app %s/%s: create one-off pod: %w", o.App.Namespace, o.App.Name, err)
	}
	return nil
}

// remove deletes the pod whatever ctx says, promptly: the run is over.
func (r *OneOffs) remove(ns, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	grace := int64(1)
	_ = r.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
}

// containerState is the one-off container's status, nil before it has one.
func containerState(pod *corev1.Pod) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == OneOffContainer {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// cannotStart is the kubelet's reason why the container will not start, or "".
func cannotStart(cs *corev1.ContainerStatus) string {
	if cs == nil || cs.State.Waiting == nil {
		return ""
	}
	switch w := cs.State.Waiting; w.Reason {
	case "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError":
		return w.Reason + ": " + w.Message
	}
	return ""
}

// exitOf is the exit status of a finished pod, ok false while it runs.
func exitOf(pod *corev1.Pod) (int, bool) {
	if pod.Status.Reason == "DeadlineExceeded" {
		return 137, true
	}
	if f := execFailure(pod); f != nil {
		return f.Status, true
	}
	if cs := containerState(pod); cs != nil && cs.State.Terminated != nil {
		return int(cs.State.Terminated.ExitCode), true
	}
	if pod.Status.Phase == corev1.PodFailed {
		return 137, true // killed before the container reported (deadline, eviction)
	}
	return 0, false
}

// execFailure is why the one-off's command could not be executed (not found,
// not executable), nil for any other end: the kubelet reports a container
// runc would not start as terminated, StartError (containerd) or
// ContainerCannotRun (docker), with runc's message.
func execFailure(pod *corev1.Pod) *runtime.ExecFailure {
	cs := containerState(pod)
	if cs == nil || cs.State.Terminated == nil {
		return nil
	}
	switch t := cs.State.Terminated; t.Reason {
	case "StartError", "ContainerCannotRun":
		return runtime.ParseExecFailure(t.Message)
	}
	return nil
}

// wait polls the pod until done says so.
func (r *OneOffs) wait(ctx context.Context, ns, name string, done func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	t := time.NewTicker(oneOffPoll)
	defer t.Stop()
	for {
		pod, err := r.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("one-off pod %s/%s is gone", ns, name)
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		} else if ok, err := done(pod); ok || err != nil {
			return pod, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// started waits until the container runs or has ended.
func (r *OneOffs) started(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return r.wait(ctx, ns, name, func(pod *corev1.Pod) (bool, error) {
		if _, ok := exitOf(pod); ok {
			return true, nil
		}
		cs := containerState(pod)
		if why := cannotStart(cs); why != "" {
			return false, fmt.Errorf("one-off pod %s cannot start: %s", name, why)
		}
		return cs != nil && cs.State.Running != nil, nil
	})
}

// finished waits for the pod's exit status.
func (r *OneOffs) finished(ctx context.Context, ns, name string) (int, error) {
	var exit int
	_, err := r.wait(ctx, ns, name, func(pod *corev1.Pod) (bool, error) {
		var ok bool
		exit, ok = exitOf(pod)
		return ok, nil
	})
	if err != nil {
		return -1, err
	}
	return exit, nil
}

// Run runs o in a pod and follows it to its end. With a TTY it is attached
// (stdin, the terminal's output, resizes): what the process writes before the
// attach is connected is only in its log. Without one its output is the pod's
// log, followed from its start (both streams go to Stdout, Stderr when Stdout
// is nil), and stdin, when given, is written through an attach of stdin alone.
func (r *OneOffs) Run(ctx context.Context, o runtime.OneOff) (int, error) {
	if err := checkOneOff(o); err != nil {
		return -1, err
	}
	if o.Timeout > 0 {
		// The pod's activeDeadlineSeconds counts from its start on the node;
		// this bounds the wait for a pod that never gets there too.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout+10*time.Second)
		defer cancel()
	}
	attach := o.Stdin != nil || o.TTY != nil
	ns, name := o.App.Namespace, OneOffPodName(o.App.Name, o.ID)
	if err := r.create(ctx, o, attach); err != nil {
		return -1, err
	}
	defer r.remove(ns, name)
	pod, err := r.started(ctx, ns, name)
	if err != nil {
		return r.ended(ctx, o, err)
	}
	if f := execFailure(pod); f != nil {
		// As a shell says it: the line a shell prints, its status.
		w, line := o.Stderr, f.Error()+"\n"
		if o.TTY != nil {
			w, line = o.Stdout, f.Error()+"\r\n"
		} else if w == nil {
			w = o.Stdout
		}
		if w != nil {
			_, _ = io.WriteString(w, line)
		}
		return f.Status, nil
	}
	// A command quicker than the pod's start (echo; exit 7) has ended by now: its
	// output is still in the pod's log, which follow reads to its end at once.
	if _, done := exitOf(pod); o.TTY != nil && !done {
		err = r.attach(ctx, o, name, o.Stdin, o.Stdout, nil)
	} else {
		err = r.follow(ctx, o, name)
	}
	if err != nil && ctx.Err() != nil {
		return r.ended(ctx, o, ctx.Err())
	}
	exit, err := r.finished(ctx, ns, name)
	if err != nil {
		return r.ended(ctx, o, err)
	}
	return exit, nil
}

// ended is the answer of a run cut short: 137 when its Timeout passed.
func (r *OneOffs) ended(ctx context.Context, o runtime.OneOff, err error) (int, error) {
	if o.Timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return 137, nil
	}
	return -1, err
}

// follow copies the pod's log to the run's output until the container ends,
// writing Stdin through an attach meanwhile.
func (r *OneOffs) follow(ctx context.Context, o runtime.OneOff, name string) error {
	out := o.Stdout
	if out == nil {
		out = o.Stderr
	}
	if o.Stdin != nil {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _ = r.attach(actx, o, name, o.Stdin, nil, nil) }()
	}
	rc, err := r.cs.CoreV1().Pods(o.App.Namespace).GetLogs(name, &corev1.PodLogOptions{Container: OneOffContainer, Follow: true}).Stream(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	if out == nil {
		out = io.Discard
	}
	_, err = io.Copy(out, rc)
	return err
}

// sizeQueue feeds an attach the terminal's sizes: the first, then Resize's.
type sizeQueue struct {
	first *remotecommand.TerminalSize
	ch    <-chan runtime.WindowSize
	done  <-chan struct{}
}

func (q *sizeQueue) Next() *remotecommand.TerminalSize {
	if f := q.first; f != nil {
		q.first = nil
		return f
	}
	select {
	case s, ok := <-q.ch:
		if !ok {
			<-q.done
			return nil
		}
		return &remotecommand.TerminalSize{Width: s.Width, Height: s.Height}
	case <-q.done:
		return nil
	}
}

// attach attaches to the one-off container (pods/attach), as `kubectl attach`
// does: websocket (v5, which can close stdin alone), SPDY when the server does
// not upgrade to it.
func (r *OneOffs) attach(ctx context.Context, o runtime.OneOff, name string, stdin io.Reader, stdout, stderr io.Writer) error {
	tty := o.TTY != nil
	req := r.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(o.App.Namespace).Name(name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{
			Container: OneOffContainer,
			Stdin:     stdin != nil,
			Stdout:    stdout != nil,
			Stderr:    stderr != nil && !tty,
			TTY:       tty,
		}, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(r.rc, "POST", req.URL())
	if err != nil {
		return err
	}
	ws, err := remotecommand.NewWebSocketExecutor(r.rc, "GET", req.URL().String())
	if err != nil {
		return err
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	opts := remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Tty: tty}
	if stderr != nil && !tty {
		opts.Stderr = stderr
	}
	if tty {
		done := make(chan struct{})
		defer close(done)
		q := &sizeQueue{ch: o.TTY.Resize, done: done}
		if o.TTY.Width > 0 && o.TTY.Height > 0 {
			q.first = &remotecommand.TerminalSize{Width: o.TTY.Width, Height: o.TTY.Height}
		}
		opts.TerminalSizeQueue = q
	}
	return exec.StreamWithContext(ctx, opts)
}

// Start starts o's pod and returns once its container runs; a goroutine
// follows it to its end, calls done with the exit status and deletes it.
func (r *OneOffs) Start(ctx context.Context, o runtime.OneOff, done func(exit int)) error {
	if err := checkOneOff(o); err != nil {
		return err
	}
	o.Stdin, o.Stdout, o.Stderr, o.TTY = nil, nil, nil, nil
	ns, name := o.App.Namespace, OneOffPodName(o.App.Name, o.ID)
	if err := r.create(ctx, o, false); err != nil {
		return err
	}
	if _, err := r.started(ctx, ns, name); err != nil {
		r.remove(ns, name)
		return err
	}
	go func() {
		fctx := context.Background()
		if o.Timeout > 0 {
			var cancel context.CancelFunc
			fctx, cancel = context.WithTimeout(fctx, o.Timeout+time.Minute)
			defer cancel()
		}
		exit, err := r.finished(fctx, ns, name)
		if err != nil {
			exit = -1
			if o.Timeout > 0 && errors.Is(fctx.Err(), context.DeadlineExceeded) {
				exit = 137
			}
		}
		r.remove(ns, name)
		if done != nil {
			done(exit)
		}
	}()
	return nil
}
