package sshcmd

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/appops"
)

// ProcessInfo is one process type in `ps --json` and `apps:info --json`.
type ProcessInfo struct {
	Type     string   `json:"type"`
	Command  []string `json:"command"`
	Replicas int32    `json:"replicas"`
	// RestartedAt is the last ps:restart of the type or the app (RFC3339), or "".
	RestartedAt string `json:"restartedAt"`
	// Resources are the limits of each instance (ps:resources), defaults included.
	Resources appops.ResourceInfo `json:"resources"`
}

// PsResources is `ps:resources --json`.
type PsResources struct {
	App       string              `json:"app"`
	Type      string              `json:"type"`
	Resources appops.ResourceInfo `json:"resources"`
}

// PsList is `ps --json`.
type PsList struct {
	App       string        `json:"app"`
	Phase     string        `json:"phase"`
	Revision  int64         `json:"revision"`
	Suspended bool          `json:"suspended"`
	Processes []ProcessInfo `json:"processes"`
	// Trouble is the RolledOut condition's reason and message when it is not
	// true (e.g. OOMKilled: an instance was killed by its memory limit), else "".
	Trouble        string `json:"trouble"`
	TroubleMessage string `json:"troubleMessage"`
}

// trouble is the RolledOut condition when it is not true.
func trouble(a *appv1.App) (string, string) {
	c := meta.FindStatusCondition(a.Status.Conditions, appv1.RolledOutCondition)
	if c == nil || c.Status == metav1.ConditionTrue {
		return "", ""
	}
	return c.Reason, c.Message
}

// limitsLine is an instance's limits for people: "512Mi, no CPU cap".
func limitsLine(r appops.ResourceInfo) string {
	cpu := "no CPU cap"
	if r.CPU != "" {
		cpu = r.CPU + " CPU"
	}
	return r.Memory + ", " + cpu
}

func processes(a *appv1.App) []ProcessInfo {
	out := []ProcessInfo{}
	for _, name := range sortedKeys(a.Spec.Processes) {
		p := a.Spec.Processes[name]
		at := a.Annotations[appv1.RestartedAtAnnotation+"."+name]
		if all := a.Annotations[appv1.RestartedAtAnnotation]; all > at {
			at = all
		}
		out = append(out, ProcessInfo{Type: name, Command: nonNil(p.Command), Replicas: p.Replicas, RestartedAt: at, Resources: appops.ResourcesOf(p)})
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string { return appops.SortedKeys(m) }

func commandLine(cmd []string) string {
	if len(cmd) == 0 {
		return "(the image's command)"
	}
	q := make([]string, len(cmd))
	for i, c := range cmd {
		q[i] = shellQuote(c)
	}
	return strings.Join(q, " ")
}

func (s *session) psCommands() []*cobra.Command {
	var asJSON bool
	ps := newCmd(groupRun, "ps APP", "Show an app's process types and their scale", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		out := PsList{App: app.Name, Phase: phase(app), Revision: app.Status.Revision, Suspended: app.Spec.Suspended, Processes: processes(app)}
		out.Trouble, out.TroubleMessage = trouble(app)
		if asJSON {
			return s.json(out)
		}
		if len(out.Processes) == 0 {
			fmt.Fprintf(s.out, "%s has no processes yet: git push deploys it.\n", app.Name)
			return nil
		}
		if out.Suspended {
			fmt.Fprintf(s.out, "%s is suspended: nothing runs (resume %s).\n", app.Name, app.Name)
		}
		if out.Trouble != "" && out.Trouble != appv1.RollingOutReason {
			fmt.Fprintf(s.out, "%s: %s\n", out.Trouble, out.TroubleMessage)
		}
		w := s.table()
		fmt.Fprintln(w, "TYPE\tREPLICAS\tMEMORY\tCPU\tCOMMAND")
		for _, p := range out.Processes {
			cpu := p.Resources.CPU
			if cpu == "" {
				cpu = "-"
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", p.Type, p.Replicas, p.Resources.Memory, cpu, commandLine(p.Command))
		}
		return w.Flush()
	})
	jsonFlag(ps, &asJSON)

	var memory, cpu string
	var resJSON bool
	resources := newCmd(groupRun, "ps:resources APP TYPE [--memory Q|default] [--cpu Q|none]", "Show or set the memory and CPU of each instance of a process type", args(2, 2), func(_ *cobra.Command, a []string) error {
		var ch appops.ResourceChange
		var parts []string
		switch memory {
		case "":
		case "default":
			ch.ResetMemory = true
			parts = append(parts, "memory default")
		default:
			q, err := resource.ParseQuantity(memory)
			if err != nil {
				return fail("--memory %q is not a size: use e.g. 256Mi, 1Gi (or default for 512Mi)", memory)
			}
			ch.Memory = &q
			parts = append(parts, "memory "+q.String())
		}
		switch cpu {
		case "":
		case "none":
			ch.NoCPU = true
			parts = append(parts, "cpu none")
		default:
			q, err := resource.ParseQuantity(cpu)
			if err != nil {
				return fail("--cpu %q is not a number of CPUs: use e.g. 500m, 2 (or none for no cap)", cpu)
			}
			ch.CPU = &q
			parts = append(parts, "cpu "+q.String())
		}
		var ri appops.ResourceInfo
		if len(parts) == 0 {
			app, err := s.app(a[0])
			if err != nil {
				return err
			}
			p, ok := app.Spec.Processes[a[1]]
			if !ok {
				return fail("%s has no process type %q: its types are %s", app.Name, a[1], strings.Join(sortedKeys(app.Spec.Processes), ", "))
			}
			ri = appops.ResourcesOf(p)
		} else {
			var err error
			if ri, err = s.ops.SetResources(s.ctx, s.user, a[0], a[1], ch); err != nil {
				return err
			}
			s.audit("ps:resources", a[0], "type", a[1], "resources", strings.Join(parts, " "))
		}
		if resJSON {
			return s.json(PsResources{App: a[0], Type: a[1], Resources: ri})
		}
		if len(parts) == 0 {
			fmt.Fprintf(s.out, "Each %s instance of %s may use %s.\n", a[1], a[0], limitsLine(ri))
			return nil
		}
		fmt.Fprintf(s.out, "Set %s of %s to %s: its instances are replaced, the new ones ready before the old stop.\n", a[1], a[0], limitsLine(ri))
		return nil
	})
	resources.Flags().StringVar(&memory, "memory", "", "memory limit of each instance (e.g. 256Mi, 1Gi; default: back to 512Mi); over it the instance is killed (OOMKilled) and restarted")
	resources.Flags().StringVar(&cpu, "cpu", "", "CPUs each instance may use (e.g. 500m, 2; none: no cap), also its share under contention")
	jsonFlag(resources, &resJSON)

	scale := newCmd(groupRun, "ps:scale APP TYPE=N...", "Set how many instances of each process type run", args(2, -1), func(_ *cobra.Command, a []string) error {
		want := map[string]int32{}
		var order []string
		for _, tn := range a[1:] {
			t, n, ok := strings.Cut(tn, "=")
			count, err := strconv.Atoi(n)
			if !ok || err != nil || count < 0 || count > appv1.MaxReplicas {
				return fail("%q is not TYPE=N with N from 0 to %d, e.g. ps:scale %s web=2", tn, appv1.MaxReplicas, a[0])
			}
			if _, dup := want[t]; !dup {
				order = append(order, t)
			}
			want[t] = int32(count)
		}
		if err := s.ops.Scale(s.ctx, s.user, a[0], order, want); err != nil {
			return err
		}
		var parts []string
		for _, t := range order {
			parts = append(parts, fmt.Sprintf("%s=%d", t, want[t]))
		}
		s.audit("ps:scale", a[0], "scale", strings.Join(parts, " "))
		fmt.Fprintf(s.out, "Scaled %s to %s.\n", a[0], strings.Join(parts, ", "))
		return nil
	})

	restart := newCmd(groupRun, "ps:restart APP [TYPE]", "Replace an app's instances (or one type's) with fresh ones", args(1, 2), func(_ *cobra.Command, a []string) error {
		key, what := appv1.RestartedAtAnnotation, "every process of "+a[0]
		if len(a) == 2 {
			key, what = appv1.RestartedAtAnnotation+"."+a[1], a[1]+" of "+a[0]
		}
		now := time.Now().UTC().Format(time.RFC3339Nano)
		_, err := s.updateApp(a[0], func(app *appv1.App) error {
			if len(a) == 2 {
				if _, ok := app.Spec.Processes[a[1]]; !ok {
					return fail("%s has no process type %q: its types are %s", app.Name, a[1], strings.Join(sortedKeys(app.Spec.Processes), ", "))
				}
			}
			if app.Annotations == nil {
				app.Annotations = map[string]string{}
			}
			app.Annotations[key] = now
			return nil
		})
		if err != nil {
			return err
		}
		s.audit("ps:restart", a[0], "annotation", key)
		fmt.Fprintf(s.out, "Restarting %s: new instances start, the old ones stop once the new are ready.\n", what)
		return nil
	})

	suspend := newCmd(groupRun, "suspend APP", "Stop every process of an app (the edge answers 503)", args(1, 1), func(_ *cobra.Command, a []string) error {
		return s.setSuspended(a[0], true)
	})
	resume := newCmd(groupRun, "resume APP", "Start a suspended app again, on the same release", args(1, 1), func(_ *cobra.Command, a []string) error {
		return s.setSuspended(a[0], false)
	})
	return append([]*cobra.Command{ps, scale, resources, restart, suspend, resume}, s.releaseCommands()...)
}

func (s *session) setSuspended(name string, suspended bool) error {
	if err := s.ops.SetSuspended(s.ctx, s.user, name, suspended); err != nil {
		return err
	}
	if suspended {
		s.audit("suspend", name)
		fmt.Fprintf(s.out, "Suspended %s: its processes stop.\n", name)
	} else {
		s.audit("resume", name)
		fmt.Fprintf(s.out, "Resumed %s: its processes start again.\n", name)
	}
	return nil
}

// DomainList is `domains --json`.
type DomainList struct {
	App string `json:"app"`
	// URL is where the app answers by default.
	URL     string   `json:"url"`
	Domains []string `json:"domains"`
}

var domainRE = regexp.MustCompile(`^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func (s *session) domainCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupConfig, "domains APP", "List an app's custom domains", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		out := DomainList{App: app.Name, URL: app.Status.URL, Domains: nonNil(app.Spec.Domains)}
		if asJSON {
			return s.json(out)
		}
		if len(out.Domains) == 0 {
			fmt.Fprintf(s.out, "%s has no custom domains: domains:add %s www.example.com adds one.\n", app.Name, app.Name)
		}
		for _, d := range out.Domains {
			fmt.Fprintln(s.out, d)
		}
		return nil
	})
	jsonFlag(list, &asJSON)

	add := newCmd(groupConfig, "domains:add APP DOMAIN", "Serve an app on a domain too (point its DNS here)", args(2, 2), func(_ *cobra.Command, a []string) error {
		d := strings.TrimSuffix(strings.ToLower(a[1]), ".")
		if len(d) > 253 || !domainRE.MatchString(d) || !strings.Contains(d, ".") {
			return fail("%q is not a domain name: use a name like www.example.com (or *.example.com)", a[1])
		}
		if _, err := s.app(a[0]); err != nil {
			return err
		}
		// A domain routes to one app: refuse one another app has, without naming
		// an app the user may not know of.
		var apps appv1.AppList
		if err := s.cfg.Reader.List(s.ctx, &apps, client.InNamespace(s.cfg.Namespace)); err != nil {
			return err
		}
		for _, other := range apps.Items {
			if other.Name != a[0] && slices.Contains(other.Spec.Domains, d) {
				return fail("%s is served by another app already: remove it there first", d)
			}
		}
		_, err := s.updateApp(a[0], func(app *appv1.App) error {
			if slices.Contains(app.Spec.Domains, d) {
				return fail("%s serves %s already", app.Name, d)
			}
			app.Spec.Domains = append(app.Spec.Domains, d)
			return nil
		})
		if err != nil {
			return err
		}
		s.audit("domains:add", a[0], "domain", d)
		fmt.Fprintf(s.out, "Added %s to %s: point its DNS at this server; the certificate comes on the first request.\n", d, a[0])
		return nil
	})

	remove := newCmd(groupConfig, "domains:remove APP DOMAIN", "Stop serving an app on a domain", args(2, 2), func(_ *cobra.Command, a []string) error {
		d := strings.TrimSuffix(strings.ToLower(a[1]), ".")
		_, err := s.updateApp(a[0], func(app *appv1.App) error {
			if !slices.Contains(app.Spec.Domains, d) {
				return fail("%s does not serve %q (domains %s lists its domains)", app.Name, a[1], app.Name)
			}
			app.Spec.Domains = slices.DeleteFunc(app.Spec.Domains, func(x string) bool { return x == d })
			return nil
		})
		if err != nil {
			return err
		}
		s.audit("domains:remove", a[0], "domain", d)
		fmt.Fprintf(s.out, "Removed %s from %s.\n", d, a[0])
		return nil
	})
	return []*cobra.Command{list, add, remove}
}

// isNotFound is apierrors.IsNotFound, for the files that need nothing else of it.
func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
