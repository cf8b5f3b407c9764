package kube

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// LogOptions select what ReadLogs prints.
type LogOptions struct {
	// Follow keeps printing new lines, of new pods too, until ctx ends.
	Follow bool
	// Lines is how many recent lines of each pod to print first (0: 100).
	Lines int
	// Process, when not empty, keeps the pods of that process type only.
	Process string
}

// logPoll is how often a follow looks for pods that started since: a ps:restart
// or a new release replaces them, and their lines belong to the app's log.
const logPoll = time.Second

// ReadLogs writes what the app's pods print to w, each line prefixed with its
// process type and pod ("web[r3 hello-web-5d8f-abcde]: ..."), through the API
// server's pod logs (the kubelet's files are on the nodes). With Follow it
// streams each pod's log until ctx ends, picking up pods that start meanwhile.
func ReadLogs(ctx context.Context, cs kubernetes.Interface, app types.NamespacedName, opts LogOptions, w io.Writer) error {
	tail := int64(opts.Lines)
	if tail <= 0 {
		tail = 100
	}
	sel := map[string]string{LabelApp: app.Name}
	if opts.Process != "" {
		sel[LabelProcess] = opts.Process
	}
	listOpts := metav1.ListOptions{LabelSelector: labels.SelectorFromSet(sel).String()}
	pods := func() ([]corev1.Pod, error) {
		list, err := cs.CoreV1().Pods(app.Namespace).List(ctx, listOpts)
		if err != nil {
			return nil, err
		}
		// The helper pods of volumes' backups have the archive as their output.
		items := slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Labels[LabelVolumeData] != "" })
		slices.SortFunc(items, func(a, b corev1.Pod) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		return items, nil
	}
	// Lines of several pods go to one writer: one line at a time.
	var mu sync.Mutex
	writeLine := func(prefix, line string) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := fmt.Fprintf(w, "%s: %s\n", prefix, line)
		return err
	}
	copyLog := func(pod corev1.Pod, follow bool, tail *int64) error {
		req := cs.CoreV1().Pods(app.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Follow: follow, TailLines: tail})
		rc, err := req.Stream(ctx)
		if err != nil {
			return err
		}
		defer rc.Close()
		prefix := podPrefix(pod)
		s := bufio.NewScanner(rc)
		s.Buffer(make([]byte, 64*1024), 1024*1024)
		for s.Scan() {
			if err := writeLine(prefix, s.Text()); err != nil {
				return err
			}
		}
		return s.Err()
	}

	first, err := pods()
	if err != nil {
		return fmt.Errorf("list the pods of %s: %w", app, err)
	}
	if !opts.Follow {
		for _, pod := range first {
			if !started(pod) {
				continue
			}
			if err := copyLog(pod, false, &tail); err != nil && ctx.Err() == nil {
				// A pod that went away meanwhile has nothing more to say.
				_ = writeLine(podPrefix(pod), "(log unavailable: "+err.Error()+")")
			}
		}
		return nil
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	streaming := map[types.UID]bool{}
	seen := map[types.UID]bool{}
	for _, pod := range first {
		seen[pod.UID] = true
	}
	start := func(pod corev1.Pod, tail *int64) {
		streaming[pod.UID] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = copyLog(pod, true, tail)
		}()
	}
	for _, pod := range first {
		if started(pod) {
			start(pod, &tail)
		}
	}
	t := time.NewTicker(logPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		list, err := pods()
		if err != nil {
			continue
		}
		for _, pod := range list {
			if streaming[pod.UID] || !started(pod) {
				continue
			}
			// A pod there from the start gets its tail; one that started
			// since gets all it printed.
			var from *int64
			if seen[pod.UID] {
				from = &tail
			}
			start(pod, from)
		}
	}
}

// started tells whether a pod has a container that ran: before that the API
// server has no log to give.
func started(pod corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil {
			return true
		}
	}
	return false
}

// podPrefix names a pod's lines as the local runtime names an instance's:
// process type and release, then the pod.
func podPrefix(pod corev1.Pod) string {
	return fmt.Sprintf("%s[r%s %s]", pod.Labels[LabelProcess], pod.Labels[LabelRelease], pod.Name)
}
