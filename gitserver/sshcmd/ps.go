package sshcmd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// limitsLine is an instance's limits for people: "512Mi, no CPU cap".
func limitsLine(r backend.ResourceInfo) string {
	cpu := "no CPU cap"
	if r.CPU != "" {
		cpu = r.CPU + " CPU"
	}
	return r.Memory + ", " + cpu
}

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
		out, err := s.b.Processes(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out.Processes) == 0 {
			fmt.Fprintf(s.out, "%s has no processes yet: git push deploys it.\n", out.App)
			return nil
		}
		if out.Suspended {
			fmt.Fprintf(s.out, "%s is suspended: nothing runs (resume %s).\n", out.App, out.App)
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
		var ch backend.ResourceChange
		switch memory {
		case "":
		case "default":
			ch.ResetMemory = true
		default:
			q, err := resource.ParseQuantity(memory)
			if err != nil {
				return fail("--memory %q is not a size: use e.g. 256Mi, 1Gi (or default for 512Mi)", memory)
			}
			ch.Memory = &q
		}
		switch cpu {
		case "":
		case "none":
			ch.NoCPU = true
		default:
			q, err := resource.ParseQuantity(cpu)
			if err != nil {
				return fail("--cpu %q is not a number of CPUs: use e.g. 500m, 2 (or none for no cap)", cpu)
			}
			ch.CPU = &q
		}
		var ri backend.ResourceInfo
		var err error
		if ch.IsZero() {
			ri, err = s.b.Resources(s.ctx, s.user, a[0], a[1])
		} else {
			ri, err = s.b.SetResources(s.ctx, s.user, a[0], a[1], ch)
		}
		if err != nil {
			return err
		}
		if resJSON {
			return s.json(backend.ProcessResources{App: a[0], Type: a[1], Resources: ri})
		}
		if ch.IsZero() {
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
		if _, err := s.b.Scale(s.ctx, s.user, a[0], order, want); err != nil {
			return err
		}
		parts := make([]string, len(order))
		for i, t := range order {
			parts[i] = fmt.Sprintf("%s=%d", t, want[t])
		}
		fmt.Fprintf(s.out, "Scaled %s to %s.\n", a[0], strings.Join(parts, ", "))
		return nil
	})

	restart := newCmd(groupRun, "ps:restart APP [TYPE]", "Replace an app's instances (or one type's) with fresh ones", args(1, 2), func(_ *cobra.Command, a []string) error {
		process, what := "", "every process of "+a[0]
		if len(a) == 2 {
			process, what = a[1], a[1]+" of "+a[0]
		}
		if err := s.b.Restart(s.ctx, s.user, a[0], process); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Restarting %s: new instances start, the old ones stop once the new are ready.\n", what)
		return nil
	})

	suspend := newCmd(groupRun, "suspend APP", "Stop every process of an app (the edge answers 503)", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.b.SetSuspended(s.ctx, s.user, a[0], true); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Suspended %s: its processes stop.\n", a[0])
		return nil
	})
	resume := newCmd(groupRun, "resume APP", "Start a suspended app again, on the same release", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.b.SetSuspended(s.ctx, s.user, a[0], false); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Resumed %s: its processes start again.\n", a[0])
		return nil
	})
	return append([]*cobra.Command{ps, scale, resources, restart, suspend, resume}, s.releaseCommands()...)
}

func (s *session) domainCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupConfig, "domains APP", "List an app's custom domains", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.Domains(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out.Domains) == 0 {
			fmt.Fprintf(s.out, "%s has no custom domains: domains:add %s www.example.com adds one.\n", out.App, out.App)
		}
		for _, d := range out.Domains {
			fmt.Fprintln(s.out, d)
		}
		return nil
	})
	jsonFlag(list, &asJSON)

	add := newCmd(groupConfig, "domains:add APP DOMAIN", "Serve an app on a domain too (point its DNS here)", args(2, 2), func(_ *cobra.Command, a []string) error {
		d, err := s.b.AddDomain(s.ctx, s.user, a[0], a[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Added %s to %s: point its DNS at this server; the certificate comes on the first request.\n", d, a[0])
		return nil
	})

	remove := newCmd(groupConfig, "domains:remove APP DOMAIN", "Stop serving an app on a domain", args(2, 2), func(_ *cobra.Command, a []string) error {
		d, err := s.b.RemoveDomain(s.ctx, s.user, a[0], a[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Removed %s from %s.\n", d, a[0])
		return nil
	})
	return []*cobra.Command{list, add, remove}
}
