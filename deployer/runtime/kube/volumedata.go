package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/volumearchive"
)

// Backups and restores of a volume on a cluster (volumes:backup,
// volumes:restore) run in a helper pod: the gitserver has no access to the
// nodes' disks, and a ReadWriteOnce claim is reached only from a pod on the node
// it is attached to. The pod runs Config.HelperImage (bex's own image) with
// `bex volume-archive backup|restore /volume` (internal/volumearchive: the
// same checks of a hostile archive as on one machine), mounts that one claim at
// /volume and nothing else, runs as the pod's uid 0 (the app's root, in the
// pod's user namespace unless Config.HostUsers) with the app pods'
// confinement, and prefers the node of the app's pods, as one-offs do.
//
// The pod is VolumeDataPodName(app, volume) (<app>-voldata-<volume>) in the
// app's namespace, labelled LabelApp, LabelVolume and LabelVolumeData (backup or
// restore), owned by the App, restartPolicy Never, activeDeadlineSeconds
// VolumeDataDeadline, and deleted when the transfer ends. Its fixed name makes
// the backups and restores of one volume take turns (a second one is refused
// while the pod exists). The gitserver attaches to it (pods/attach, websocket
// with a SPDY fallback, as one-offs): a backup's archive is its stdout, after a
// handshake that waits for the attach (volumearchive.AwaitReader); a restore's
// is its stdin. The container's stdout is also in its log on the node (the
// kubelet keeps what a container writes) until the pod is deleted; `logs APP`
// leaves these pods out.
//
// Consistency: nothing pauses the app's pods (there is no freezer across
// pods): a copy taken while the app runs can miss writes in flight, and a
// restore runs beside it. `suspend APP` first (its Deployments at 0, the claim
// stays) gives a still copy; the gitserver says so when the app runs.

// LabelVolumeData marks the helper pod of a volume's backup or restore; its
// value is "backup" or "restore".
const LabelVolumeData = "app.bex.co/volume-data"

// VolumeDataDeadline is the helper pod's activeDeadlineSeconds: the longest a
// backup or restore may take (the pod of a gitserver that died meanwhile goes
// by then at the latest).
const VolumeDataDeadline = 6 * time.Hour

// volumeDataStartTimeout bounds the wait for the helper pod to run: its image
// pulled, its claim attached (a claim held by the app's pods on another node
// keeps it waiting).
const volumeDataStartTimeout = 3 * time.Minute

// volumeDataMount is where the helper pod mounts the claim.
const volumeDataMount = "/volume"

// HelperBinary is bex's path in its image (hack/image/Dockerfile).
const HelperBinary = "/usr/local/bin/bex"

// ErrVolumeBusy is returned while another backup or restore of the volume runs.
var ErrVolumeBusy = errors.New("a backup or restore of the volume is running")

// VolumeDataPodName is the helper pod of the backups and restores of volume
// name of app.
func VolumeDataPodName(app, name string) string { return app + "-voldata-" + name }

// VolumeData reads and replaces the contents of apps' volumes on a cluster,
// through a helper pod per transfer (see above). The gitserver uses it.
type VolumeData struct {
	oo *OneOffs
}

// NewVolumeData returns the volume transfers of the cluster rc names; cfg is
// the runtime's Config, whose HelperImage must be set.
func NewVolumeData(cfg Config, rc *rest.Config) (*VolumeData, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kube volume data: %w", err)
	}
	if cfg.HelperImage == "" {
		return nil, errors.New("kube volume data: Config.HelperImage is empty: backups and restores run bex's own image in a pod (the gitserver's --volume-helper-image)")
	}
	if rc == nil {
		return nil, errors.New("kube volume data: no rest config")
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube volume data: %w", err)
	}
	return &VolumeData{oo: &OneOffs{cfg: cfg, cs: cs, rc: rc}}, nil
}

// Usage is -1 (unknown: the file system is on a node) and the claim's
// capacity (its request while it is not bound); an error wrapping
// fs.ErrNotExist when the claim does not exist.
func (v *VolumeData) Usage(ctx context.Context, key types.NamespacedName, name string) (used, size int64, err error) {
	pvc, err := v.oo.cs.CoreV1().PersistentVolumeClaims(key.Namespace).Get(ctx, VolumeClaimName(key.Name, name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, 0, fmt.Errorf("volume %s of %s: no PersistentVolumeClaim %s: %w", name, key, VolumeClaimName(key.Name, name), fs.ErrNotExist)
	}
	if err != nil {
		return 0, 0, err
	}
	if pvc.DeletionTimestamp != nil {
		return 0, 0, fmt.Errorf("volume %s of %s is being deleted: %w", name, key, fs.ErrNotExist)
	}
	q, ok := pvc.Status.Capacity[corev1.ResourceStorage]
	if !ok {
		q = pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	}
	return -1, q.Value(), nil
}

// volumeDataPod is the helper pod of a backup or restore (mode) of volume name
// of app.
func volumeDataPod(cfg Config, app *appv1.App, name, mode string) *corev1ac.PodApplyConfiguration {
	command := []string{HelperBinary, "--go-memory-limit=96Mi", "volume-archive", mode, "--termination-log=" + corev1.TerminationMessagePathDefault}
	if mode == "backup" {
		command = append(command, "--handshake")
	}
	command = append(command, volumeDataMount)
	mem := resource.MustParse("128Mi")
	sc := securityContext().
		// The image's user is bex's (65532); the archive's ids are the app's,
		// from its root: uid 0 of the pod, the app's root in its user namespace.
		WithRunAsUser(0).WithRunAsGroup(0).WithRunAsNonRoot(false)
	// Named as a one-off's container: attached and followed as one is.
	c := corev1ac.Container().
		WithName(OneOffContainer).
		WithImage(cfg.HelperImage).
		WithCommand(command...).
		WithStdin(true).WithStdinOnce(true).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceMemory: mem, corev1.ResourceCPU: resource.MustParse("50m")}).
			WithLimits(corev1.ResourceList{corev1.ResourceMemory: mem})).
		WithSecurityContext(sc)
	vols := []appv1.Volume{{Name: name, Path: volumeDataMount}}
	withVolumeMounts(c, vols)
	spec := podSpec(cfg, c).
		WithRestartPolicy(corev1.RestartPolicyNever).
		WithTerminationGracePeriodSeconds(5).
		WithActiveDeadlineSeconds(int64(VolumeDataDeadline.Seconds()))
	withOneOffClaims(spec, app.Name, vols)
	return corev1ac.Pod(VolumeDataPodName(app.Name, name), app.Namespace).
		WithLabels(map[string]string{LabelApp: app.Name, LabelVolume: name, LabelVolumeData: mode}).
		WithOwnerReferences(ownerReference(app)).
		WithSpec(spec)
}

// create makes the helper pod, refusing (ErrVolumeBusy) while another runs; a
// finished one left by a gitserver that stopped is removed first.
func (v *VolumeData) create(ctx context.Context, app *appv1.App, name, mode string) error {
	var pod corev1.Pod
	b, err := json.Marshal(volumeDataPod(v.oo.cfg, app, name, mode))
	if err == nil {
		err = json.Unmarshal(b, &pod)
	}
	if err != nil {
		return err
	}
	pods := v.oo.cs.CoreV1().Pods(app.Namespace)
	for range 2 {
		_, err = pods.Create(ctx, &pod, metav1.CreateOptions{FieldManager: v.oo.cfg.FieldManager})
		if !apierrors.IsAlreadyExists(err) {
			break
		}
		old, gerr := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		if _, done := exitOf(old); !done || old.Labels[LabelVolumeData] == "" {
			return fmt.Errorf("volume %s of %s: %w (pod %s): try again once it ended", name, app.Name, ErrVolumeBusy, pod.Name)
		}
		v.oo.remove(app.Namespace, pod.Name)
		gctx, cancel := context.WithTimeout(ctx, deleteTimeout)
		_, _ = v.oo.wait(gctx, app.Namespace, pod.Name, func(*corev1.Pod) (bool, error) { return false, nil }) // until it is gone
		cancel()
	}
	if err != nil {
		return fmt.Errorf("volume %s of %s: create the helper pod: %w", name, app.Name, err)
	}
	return nil
}

// run creates the helper pod, waits for it to run, transfers (attach), and
// returns its exit status and termination message.
func (v *VolumeData) run(ctx context.Context, app *appv1.App, name, mode string, transfer func(o runtime.OneOff, pod string) error) (int, string, error) {
	if app == nil || app.Name == "" || app.Namespace == "" || app.UID == "" {
		return -1, "", errors.New("kube volume data: needs the App as read from the API server (name, namespace, UID)")
	}
	if !appv1.ValidVolumeName(name) {
		return -1, "", fmt.Errorf("volume %q: %w", name, fs.ErrNotExist)
	}
	ns, pod := app.Namespace, VolumeDataPodName(app.Name, name)
	if err := v.create(ctx, app, name, mode); err != nil {
		return -1, "", err
	}
	defer v.oo.remove(ns, pod)
	sctx, cancel := context.WithTimeout(ctx, volumeDataStartTimeout)
	p, err := v.oo.wait(sctx, ns, pod, func(p *corev1.Pod) (bool, error) {
		if _, ok := exitOf(p); ok {
			return true, nil
		}
		cs := containerState(p)
		if why := cannotStart(cs); why != "" {
			return false, fmt.Errorf("the helper pod %s cannot start: %s", pod, why)
		}
		return cs != nil && cs.State.Running != nil, nil
	})
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return -1, "", fmt.Errorf("the helper pod %s did not start within %v (its image is pulled, and its volume attached to one node at a time: kubectl -n %s describe pod %s says why)", pod, volumeDataStartTimeout, ns, pod)
		}
		return -1, "", err
	}
	o := runtime.OneOff{App: app}
	if _, done := exitOf(p); !done {
		if err := transfer(o, pod); err != nil {
			return -1, "", fmt.Errorf("volume %s of %s: %w", name, app.Name, err)
		}
	}
	p, err = v.oo.wait(ctx, ns, pod, func(p *corev1.Pod) (bool, error) {
		_, ok := exitOf(p)
		return ok, nil
	})
	if err != nil {
		return -1, "", err
	}
	exit, _ := exitOf(p)
	msg := ""
	if cs := containerState(p); cs != nil && cs.State.Terminated != nil {
		msg = strings.TrimSpace(cs.State.Terminated.Message)
	}
	if p.Status.Reason == "DeadlineExceeded" {
		msg = fmt.Sprintf("the helper pod ran past its deadline (%v)", VolumeDataDeadline)
	}
	return exit, msg, nil
}

// Backup writes the volume's contents to w as a tar archive (PAX), read by the
// helper pod while the app runs. Names are relative to the volume's root, ids
// are the app's (0 is its root).
func (v *VolumeData) Backup(ctx context.Context, app *appv1.App, name string, w io.Writer) error {
	var aw *volumearchive.Awaiter
	exit, msg, err := v.run(ctx, app, name, "backup", func(o runtime.OneOff, pod string) error {
		pr, pw := io.Pipe()
		defer pw.Close()
		var once sync.Once
		aw = &volumearchive.Awaiter{W: w, Ready: func() {
			// The attach is connected: the go-ahead, from another goroutine
			// (this one is the attach's stdout).
			once.Do(func() { go func() { _, _ = pw.Write([]byte{'g'}) }() })
		}}
		return v.oo.attach(ctx, o, pod, pr, aw, nil)
	})
	if err != nil {
		return err
	}
	if exit != 0 {
		return fmt.Errorf("volume %s of %s: the backup failed (exit %d): %s", name, app.Name, exit, msg)
	}
	if aw == nil || !aw.Started {
		return fmt.Errorf("volume %s of %s: the backup's helper pod ended before its archive began", name, app.Name)
	}
	return nil
}

// Restore replaces the volume's contents with the archive read from r, written
// by the helper pod while the app runs. An archive it refuses is an error
// wrapping volumearchive.ErrBadArchive, and the volume is as it was.
func (v *VolumeData) Restore(ctx context.Context, app *appv1.App, name string, r io.Reader) error {
	exit, msg, err := v.run(ctx, app, name, "restore", func(o runtime.OneOff, pod string) error {
		return v.oo.attach(ctx, o, pod, r, nil, nil)
	})
	if err != nil {
		return err
	}
	switch exit {
	case 0:
		return nil
	case volumearchive.ExitRefused:
		// The helper's line: "volumes:restore refused the archive, and the
		// volume is as it was: bad archive: WHY".
		why := msg
		if i := strings.Index(msg, volumearchive.ErrBadArchive.Error()+": "); i >= 0 {
			why = msg[i+len(volumearchive.ErrBadArchive.Error())+2:]
		}
		return fmt.Errorf("%w: %s", volumearchive.ErrBadArchive, why)
	}
	return fmt.Errorf("volume %s of %s: the restore failed (exit %d): %s", name, app.Name, exit, msg)
}
