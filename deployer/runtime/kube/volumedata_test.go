package kube_test

import (
	"bytes"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/volumearchive"
)

const helperImage = "registry.example/bex@sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

func volumeDataFixture(t *testing.T) (*fixture, *kube.VolumeData) {
	t.Helper()
	f := setup(t)
	if _, err := kube.NewVolumeData(kube.Config{}, testenv.SharedControlPlane(t).Config); err == nil || !strings.Contains(err.Error(), "HelperImage") {
		t.Fatalf("NewVolumeData without a helper image: %v", err)
	}
	vd, err := kube.NewVolumeData(kube.Config{HelperImage: helperImage}, testenv.SharedControlPlane(t).Config)
	if err != nil {
		t.Fatal(err)
	}
	return f, vd
}

// TestVolumeDataUsage: a volume without a claim does not exist (fs.ErrNotExist);
// one with a claim has its size, its request until it is bound and its
// capacity after, and an unknown use (-1).
func TestVolumeDataUsage(t *testing.T) {
	f, vd := volumeDataFixture(t)
	key := types.NamespacedName{Namespace: f.ns, Name: "hello"}
	if _, _, err := vd.Usage(f.ctx, key, "data"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Usage without a claim: %v, want fs.ErrNotExist", err)
	}
	d := f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}})
	d.Volumes = []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("1Gi")}}
	f.sync(d)
	used, size, err := vd.Usage(f.ctx, key, "data")
	if err != nil || used != -1 || size != 1<<30 {
		t.Fatalf("Usage of a claim not bound: %d, %d, %v", used, size, err)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: kube.VolumeClaimName("hello", "data")}, pvc); err != nil {
		t.Fatal(err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	if err := f.c.Status().Update(f.ctx, pvc); err != nil {
		t.Fatal(err)
	}
	if used, size, err := vd.Usage(f.ctx, key, "data"); err != nil || used != -1 || size != 2<<30 {
		t.Fatalf("Usage of a bound claim: %d, %d, %v", used, size, err)
	}
}

// TestVolumeDataHelperPod: the helper pod of a backup runs bex's image with
// `bex volume-archive backup`, mounts that one claim only, as uid 0 with the
// app pods' confinement, owned by the App, with a deadline; a second transfer
// of the volume is refused while it runs; a pod that ends before its archive
// began is an error, and it is deleted. A restore's exit 2 is a refusal
// (ErrBadArchive) with the helper's reason.
func TestVolumeDataHelperPod(t *testing.T) {
	f, vd := volumeDataFixture(t)
	name := kube.VolumeDataPodName("hello", "data")
	res := make(chan error, 1)
	go func() { res <- vd.Backup(f.ctx, f.app, "data", &bytes.Buffer{}) }()
	pod := f.waitPod(name)

	if l := pod.Labels; l[appv1.LabelApp] != "hello" || l[kube.LabelVolume] != "data" || l[kube.LabelVolumeData] != "backup" || l[appv1.LabelProcess] != "" {
		t.Errorf("labels %v", l)
	}
	if refs := pod.OwnerReferences; len(refs) != 1 || refs[0].UID != f.app.UID || refs[0].Kind != "App" {
		t.Errorf("owner references %+v", refs)
	}
	s := pod.Spec
	if s.RestartPolicy != corev1.RestartPolicyNever || s.ActiveDeadlineSeconds == nil || *s.ActiveDeadlineSeconds != int64(kube.VolumeDataDeadline.Seconds()) {
		t.Errorf("restartPolicy %q activeDeadlineSeconds %v", s.RestartPolicy, s.ActiveDeadlineSeconds)
	}
	if s.HostUsers == nil || *s.HostUsers || s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken || s.EnableServiceLinks == nil || *s.EnableServiceLinks {
		t.Errorf("hostUsers %v, API token %v, service links %v", s.HostUsers, s.AutomountServiceAccountToken, s.EnableServiceLinks)
	}
	if len(s.Volumes) != 1 || s.Volumes[0].PersistentVolumeClaim == nil || s.Volumes[0].PersistentVolumeClaim.ClaimName != kube.VolumeClaimName("hello", "data") {
		t.Errorf("volumes %+v", s.Volumes)
	}
	if s.Affinity == nil || s.Affinity.PodAffinity == nil || len(s.Affinity.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		s.Affinity.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector.MatchLabels[appv1.LabelApp] != "hello" {
		t.Errorf("affinity %+v", s.Affinity)
	}
	if len(s.Containers) != 1 {
		t.Fatalf("containers %+v", s.Containers)
	}
	c := s.Containers[0]
	want := "/usr/local/bin/bex --go-memory-limit=96Mi volume-archive backup --termination-log=/dev/termination-log --handshake /volume"
	if c.Image != helperImage || strings.Join(c.Command, " ") != want || len(c.Args) != 0 {
		t.Errorf("image %q command %q, want %q %q", c.Image, c.Command, helperImage, want)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/volume" || c.VolumeMounts[0].Name != s.Volumes[0].Name {
		t.Errorf("mounts %+v", c.VolumeMounts)
	}
	if !c.Stdin || !c.StdinOnce || c.TTY {
		t.Errorf("stdin %v stdinOnce %v tty %v", c.Stdin, c.StdinOnce, c.TTY)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsGroup == nil || *sc.RunAsGroup != 0 ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context %+v", sc)
	}
	if c.Resources.Limits.Memory().Value() != 128<<20 || c.Resources.Requests.Cpu().MilliValue() != 50 {
		t.Errorf("resources %+v", c.Resources)
	}

	// One transfer of a volume at a time.
	if err := vd.Restore(f.ctx, f.app, "data", strings.NewReader("")); !errors.Is(err, kube.ErrVolumeBusy) {
		t.Errorf("a restore during the backup: %v, want ErrVolumeBusy", err)
	}
	f.terminate(pod, 0, "")
	if err := <-res; err == nil || !strings.Contains(err.Error(), "ended before its archive began") {
		t.Fatalf("Backup of a pod that ended at once: %v", err)
	}
	if !f.gone(&corev1.Pod{}, name) {
		t.Error("the helper pod is still there after Backup returned")
	}

	// A restore the helper refuses.
	go func() { res <- vd.Restore(f.ctx, f.app, "data", strings.NewReader("")) }()
	pod = f.waitPod(name)
	if c := pod.Spec.Containers[0]; c.Command[3] != "restore" || c.Command[len(c.Command)-1] != "/volume" || pod.Labels[kube.LabelVolumeData] != "restore" {
		t.Errorf("restore's command %q", c.Command)
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: kube.OneOffContainer, Image: helperImage,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: volumearchive.ExitRefused,
			Message: `volumes:restore refused the archive, and the volume is as it was: bad archive: "../x" has a '..' segment: it would land outside the volume`}}}}
	if err := f.c.Status().Update(f.ctx, pod); err != nil {
		t.Fatal(err)
	}
	err := <-res
	if !errors.Is(err, volumearchive.ErrBadArchive) || err.Error() != `bad archive: "../x" has a '..' segment: it would land outside the volume` {
		t.Fatalf("Restore refused: %v", err)
	}

	// A finished helper pod left behind (its gitserver stopped) is replaced.
	go func() { res <- vd.Restore(f.ctx, f.app, "data", strings.NewReader("")) }()
	pod = f.waitPod(name)
	uid := pod.UID
	f.terminate(pod, 0, "")
	if err := <-res; err != nil {
		t.Fatalf("a restore that exits 0: %v", err)
	}
	left := pod.DeepCopy()
	left.ResourceVersion, left.UID = "", ""
	left.Status = corev1.PodStatus{}
	if err := f.c.Create(f.ctx, left); err != nil {
		t.Fatal(err)
	}
	f.terminate(left, 0, "")
	go func() { res <- vd.Backup(f.ctx, f.app, "data", &bytes.Buffer{}) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p := f.waitPod(name)
		if p.UID != left.UID && p.UID != uid {
			f.terminate(p, 1, "")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the finished pod left behind was not replaced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := <-res; err == nil || !strings.Contains(err.Error(), "the backup failed (exit 1)") {
		t.Fatalf("a backup that exits 1: %v", err)
	}
}
