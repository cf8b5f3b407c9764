package kube

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// progressDeadlineExceeded is the reason of a Deployment's Progressing condition when
// its rollout made no progress within progressDeadlineSeconds (set by the Deployment
// controller; there is no exported constant for it in k8s.io/api).
const progressDeadlineExceeded = "ProgressDeadlineExceeded"

// wantReplicas is a Deployment's spec.replicas (the API server defaults nil to 1).
func wantReplicas(dep *appsv1.Deployment) int32 {
	if dep.Spec.Replicas == nil {
		return 1
	}
	return *dep.Spec.Replicas
}

// observed tells whether the Deployment controller has seen the current spec: before
// that, the status describes an older template or scale.
func observed(dep *appsv1.Deployment) bool {
	return dep.Status.ObservedGeneration >= dep.Generation
}

// deploymentReady tells whether a Deployment has completed the rollout of its current
// spec: the controller has observed it, every wanted replica runs the current
// template and is available, and no pod of an older template is left.
func deploymentReady(dep *appsv1.Deployment) bool {
	want := wantReplicas(dep)
	s := dep.Status
	return observed(dep) &&
		s.UpdatedReplicas == want &&
		s.AvailableReplicas == want &&
		s.Replicas == s.UpdatedReplicas
}

// deadlineExceeded tells whether the rollout of the Deployment's current spec failed
// its progress deadline. A condition set for an older generation does not count.
func deadlineExceeded(dep *appsv1.Deployment) bool {
	if !observed(dep) {
		return false
	}
	for _, c := range dep.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing {
			return c.Status == corev1.ConditionFalse && c.Reason == progressDeadlineExceeded
		}
	}
	return false
}

// timedOutOther tells whether the Deployment's ProgressDeadlineExceeded is about
// a ReplicaSet none of whose pods are of release (the pods of the app's release,
// as Sync lists them). A withdrawn release sets the template back to the
// release that serves: the controller observes it and keeps the condition of
// the withdrawn ReplicaSet until that one is scaled down, which would report the
// release that serves as failed. The controller names the ReplicaSet in the
// message (`ReplicaSet "NAME" has timed out progressing.`); a ReplicaSet is named
// after its Deployment and its pods' pod-template-hash.
func timedOutOther(dep *appsv1.Deployment, process string, release int64, pods []corev1.Pod) bool {
	var msg string
	for _, c := range dep.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing {
			msg = c.Message
		}
	}
	_, rest, ok := strings.Cut(msg, `ReplicaSet "`)
	if !ok {
		return false
	}
	rs, _, ok := strings.Cut(rest, `"`)
	if !ok {
		return false
	}
	rel := strconv.FormatInt(release, 10)
	mine := 0
	for _, pod := range pods {
		if pod.Labels[LabelProcess] != process || pod.Labels[LabelRelease] != rel || pod.DeletionTimestamp != nil {
			continue
		}
		if dep.Name+"-"+pod.Labels[appsv1.DefaultDeploymentUniqueLabelKey] == rs {
			return false
		}
		mine++
	}
	// With no pod of the release at all there is nothing to tell by.
	return mine > 0
}

// readyOfTemplate is how many pods of the current template are ready, as far as the
// Deployment's status tells: availableReplicas counts old pods too, so the old ones
// (replicas - updatedReplicas) are taken away, assuming they are available (they are
// while maxUnavailable is 0). It is a lower bound, and 0 until the controller has
// observed the spec.
func readyOfTemplate(dep *appsv1.Deployment) int32 {
	if !observed(dep) {
		return 0
	}
	s := dep.Status
	n := s.AvailableReplicas - (s.Replicas - s.UpdatedReplicas)
	return max(0, min(n, s.UpdatedReplicas))
}

// templateRelease is the release label of the Deployment's pod template (0: none).
func templateRelease(dep *appsv1.Deployment) int64 {
	n, _ := strconv.ParseInt(dep.Spec.Template.Labels[LabelRelease], 10, 64)
	return n
}

// labelledServing is the Deployment's LabelServingRelease (0: none).
func labelledServing(dep *appsv1.Deployment) int64 {
	n, _ := strconv.ParseInt(dep.Labels[LabelServingRelease], 10, 64)
	return n
}

// servedRelease is the release an existing Deployment's pods serve: its template's
// release once its rollout is complete, else the one recorded when the previous
// rollout completed. Sync computes it before applying a new template and writes it
// back as the label, so that it survives the template change.
func servedRelease(dep *appsv1.Deployment) int64 {
	if dep == nil {
		return 0
	}
	if r := templateRelease(dep); r > 0 && deploymentReady(dep) {
		return r
	}
	return labelledServing(dep)
}

// processOrder is the order processes are reported in: web first, then by name, so
// that messages are stable.
func processOrder(processes map[string]appv1.ProcessSpec) []string {
	names := make([]string, 0, len(processes))
	for p := range processes {
		names = append(names, p)
	}
	slices.SortFunc(names, func(a, b string) int {
		if (a == WebProcess) != (b == WebProcess) {
			if a == WebProcess {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

// podTrouble is what the pods of one process type of the current release tell
// beyond their Deployment: how often their containers restarted, and why they
// cannot run when the kubelet says so (a failure reason of the App API and a
// sentence).
type podTrouble struct {
	restarts        int32
	oomKills        int32
	reason, message string
}

// troubleOf summarises pods by process type, counting only those of d's release
// that are not being deleted. Pods are taken in name order, so that the pod a
// message names is stable.
func troubleOf(d runtime.Desired, pods []corev1.Pod) map[string]podTrouble {
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	release := strconv.FormatInt(d.Release, 10)
	out := map[string]podTrouble{}
	for _, pod := range pods {
		if pod.Labels[LabelRelease] != release || pod.DeletionTimestamp != nil {
			continue
		}
		p := pod.Labels[LabelProcess]
		pt := out[p]
		for _, cs := range pod.Status.ContainerStatuses {
			pt.restarts += cs.RestartCount
			// The kubelet's reason for a container killed by its memory limit.
			oom := cs.LastTerminationState.Terminated != nil && cs.LastTerminationState.Terminated.Reason == appv1.OOMKilledReason
			if oom {
				pt.oomKills++
			}
			w := cs.State.Waiting
			if pt.reason == "" && oom && !cs.Ready {
				pt.reason = appv1.OOMKilledReason
				pt.message = fmt.Sprintf("instance %s ran out of memory and was killed (%d restarts; last: %s); ps:resources raises the limit", pod.Name, cs.RestartCount, lastExit(cs))
				continue
			}
			if pt.reason != "" || w == nil {
				continue
			}
			switch w.Reason {
			case "CrashLoopBackOff":
				pt.reason = appv1.CrashLoopReason
				pt.message = fmt.Sprintf("instance %s keeps exiting: %d restarts (last: %s)", pod.Name, cs.RestartCount, lastExit(cs))
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
				pt.reason = appv1.ImageNotFoundReason
				pt.message = fmt.Sprintf("instance %s cannot pull image %s: %s", pod.Name, cs.Image, w.Message)
			}
		}
		out[p] = pt
	}
	return out
}

// lastExit words a container's last termination: its exit code, and the reason
// when it says more than "Error" (OOMKilled, say).
func lastExit(cs corev1.ContainerStatus) string {
	t := cs.LastTerminationState.Terminated
	if t == nil {
		return "no exit recorded yet"
	}
	s := fmt.Sprintf("exited with code %d", t.ExitCode)
	if t.Reason != "" && t.Reason != "Error" {
		s += " (" + t.Reason + ")"
	}
	return s
}

// statusOf derives the Status of d from the Deployments of its processes as the API
// server returned them after Sync applied them (by process type; a missing one has
// not been written) and from the pods of the app. It reads nothing else, so it is a
// pure function of those states.
//
// A process whose rollout is not complete fails as soon as the kubelet reports a
// pod of the release crash-looping or unable to pull its image, as the local
// runtime reports them, rather than at the progress deadline.
func statusOf(d runtime.Desired, deps map[string]*appsv1.Deployment, pods []corev1.Pod) runtime.Status {
	st := runtime.Status{RolledOut: true, Processes: make(map[string]runtime.ProcessStatus, len(d.Processes))}
	trouble := troubleOf(d, pods)
	var waiting []string
	for _, p := range processOrder(d.Processes) {
		dep := deps[p]
		desired := d.Processes[p].Replicas
		if d.Suspended {
			desired = 0
		}
		ps := runtime.ProcessStatus{Desired: desired}
		current := dep != nil && templateRelease(dep) == d.Release
		if current {
			ps.Ready = readyOfTemplate(dep)
			ps.Restarts = trouble[p].restarts
			ps.OOMKills = trouble[p].oomKills
		}
		st.Processes[p] = ps
		if current && deploymentReady(dep) {
			continue
		}
		st.RolledOut = false
		waiting = append(waiting, fmt.Sprintf("%s %d/%d", p, ps.Ready, desired))
		if pt := trouble[p]; st.Failure == "" && current && pt.reason != "" && !d.Suspended {
			st.Failure = pt.reason
			st.Message = fmt.Sprintf("the %s process of release %d cannot run: %s",
				p, d.Release, pt.message)
		}
		if st.Failure == "" && current && deadlineExceeded(dep) && !timedOutOther(dep, p, d.Release, pods) {
			st.Failure = appv1.HealthCheckFailedReason
			st.Message = deadlineMessage(d, p, dep, ps)
		}
	}

	switch {
	case d.Suspended:
		// Suspended, nothing takes traffic (the endpoints empty as the pods stop),
		// as the local runtime reports it.
		st.Serving = 0
	case st.RolledOut:
		st.Serving = d.Release
	case hasProcess(d, WebProcess):
		// The web pods are what takes traffic: once their rollout is complete the
		// new release serves, whatever the other processes do.
		if web := deps[WebProcess]; web != nil && templateRelease(web) == d.Release && deploymentReady(web) {
			st.Serving = d.Release
		} else if web != nil {
			st.Serving = labelledServing(web)
		}
	default:
		// No web process: nothing takes traffic, so "serving" is the release every
		// process has completed a rollout of, the oldest one recorded.
		for i, p := range processOrder(d.Processes) {
			s := int64(0)
			if dep := deps[p]; dep != nil {
				s = labelledServing(dep)
			}
			if i == 0 || s < st.Serving {
				st.Serving = s
			}
		}
	}
	if st.Failure == "" && !st.RolledOut {
		st.Message = fmt.Sprintf("release %d: waiting for ready instances (%s)", d.Release, strings.Join(waiting, ", "))
	}
	return st
}

func hasProcess(d runtime.Desired, p string) bool {
	_, ok := d.Processes[p]
	return ok
}

func deadlineMessage(d runtime.Desired, process string, dep *appsv1.Deployment, ps runtime.ProcessStatus) string {
	deadline := int32(0)
	if dep.Spec.ProgressDeadlineSeconds != nil {
		deadline = *dep.Spec.ProgressDeadlineSeconds
	}
	check := "did not come up and stay running"
	if process == WebProcess {
		if d.HealthCheck != nil && d.HealthCheck.Path != "" {
			check = fmt.Sprintf("did not pass the health check (GET %s on PORT)", d.HealthCheck.Path)
		} else {
			check = "did not listen on PORT"
		}
	}
	return fmt.Sprintf("the %s process of release %d %s within the boot timeout of %ds (%d of %d instances ready)",
		process, d.Release, check, deadline, ps.Ready, ps.Desired)
}
