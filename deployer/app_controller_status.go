package deployer

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// updateStatus computes the App's status from what the phases found. Each field
// is set by one function; the phase is derived last, from the conditions.
func (r *AppReconciler) updateStatus(s *scope) {
	app := s.app
	if s.synced {
		app.Status.Revision = s.status.Serving
	}
	app.Status.URL = appURL(app, r.Config)
	setRolledOutCondition(app, s.synced, s.status)
	setReadyCondition(app, s.synced, s.status)
	if s.synced {
		app.Status.Cron = cronStatus(app.Spec.Cron, s.status.Cron)
		app.Status.Volumes = s.status.Volumes
	}
	setCronCondition(app)
	setPhase(app)
}

// appURL is where the app answers: its first custom domain, else <app>.<base domain>.
func appURL(app *appv1.App, cfg Config) string {
	host := app.Name + "." + cfg.BaseDomain
	if len(app.Spec.Domains) > 0 && !strings.HasPrefix(app.Spec.Domains[0], "*.") {
		host = app.Spec.Domains[0]
	}
	port := ""
	if cfg.URLScheme == "https" && cfg.HTTPSPort != 0 && cfg.HTTPSPort != 443 {
		port = fmt.Sprintf(":%d", cfg.HTTPSPort)
	}
	return cfg.URLScheme + "://" + host + port
}

func setRolledOutCondition(app *appv1.App, synced bool, st runtime.Status) {
	c := metav1.Condition{Type: appv1.RolledOutCondition, ObservedGeneration: app.Generation}
	switch {
	case app.Spec.Image == "":
		c.Status, c.Reason = metav1.ConditionFalse, appv1.NoReleaseReason
		c.Message = "Nothing is deployed yet: push to the app's deploy branch."
	case !synced:
		return // the runtime could not be asked; keep what was known
	case st.Failure != "":
		c.Status, c.Reason = metav1.ConditionFalse, st.Failure
		c.Message = st.Message
		if st.Serving > 0 {
			c.Message = beforeLogLines(st.Message, fmt.Sprintf(" Release v%d keeps serving.", st.Serving))
		}
	case app.Spec.Suspended && st.RolledOut:
		c.Status, c.Reason = metav1.ConditionTrue, appv1.SuspendedReason
		c.Message = "The app is suspended: no process runs."
	case st.RolledOut:
		c.Status, c.Reason = metav1.ConditionTrue, appv1.RolledOutReason
		c.Message = fmt.Sprintf("Release v%d serves: %s.", app.Spec.Release, describeProcesses(st.Processes))
	default:
		c.Status, c.Reason = metav1.ConditionFalse, appv1.RollingOutReason
		c.Message = fmt.Sprintf("Rolling out release v%d: %s.", app.Spec.Release, describeProcesses(st.Processes))
		if st.Note != "" {
			c.Message += " " + st.Note
		}
	}
	meta.SetStatusCondition(&app.Status.Conditions, c)
}

func setReadyCondition(app *appv1.App, synced bool, st runtime.Status) {
	c := metav1.Condition{Type: appv1.ReadyCondition, ObservedGeneration: app.Generation}
	rolled := meta.FindStatusCondition(app.Status.Conditions, appv1.RolledOutCondition)
	switch {
	case app.Spec.Suspended:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, appv1.SuspendedReason, "The app is suspended; resume it to serve again."
	case rolled != nil && rolled.Status == metav1.ConditionTrue && (!synced || st.Serving == app.Spec.Release):
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, appv1.RolledOutReason, rolled.Message
	case rolled != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, rolled.Reason, rolled.Message
	default:
		return
	}
	meta.SetStatusCondition(&app.Status.Conditions, c)
}

// setPhase derives the one-word summary from the conditions.
func setPhase(app *appv1.App) {
	rolled := meta.FindStatusCondition(app.Status.Conditions, appv1.RolledOutCondition)
	switch {
	case app.Spec.Suspended:
		app.Status.Phase = appv1.AppPhaseSuspended
	case app.Spec.Image == "" || rolled == nil:
		app.Status.Phase = appv1.AppPhasePending
	case rolled.Status == metav1.ConditionTrue:
		app.Status.Phase = appv1.AppPhaseRunning
	case rolled.Reason == appv1.RollingOutReason:
		app.Status.Phase = appv1.AppPhaseDeploying
	default:
		app.Status.Phase = appv1.AppPhaseFailed
	}
}

func describeProcesses(ps map[string]runtime.ProcessStatus) string {
	if len(ps) == 0 {
		return "no processes"
	}
	names := make([]string, 0, len(ps))
	for n := range ps {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		p := ps[n]
		part := fmt.Sprintf("%s %d/%d ready", n, p.Ready, p.Desired)
		if p.Restarts > 0 {
			part += fmt.Sprintf(", %d restarts", p.Restarts)
		}
		if p.OOMKills > 0 {
			part += fmt.Sprintf(" (%d %s)", p.OOMKills, appv1.OOMKilledReason)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

func phaseMessage(app *appv1.App) string {
	if c := meta.FindStatusCondition(app.Status.Conditions, appv1.RolledOutCondition); c != nil {
		return c.Message
	}
	return string(app.Status.Phase)
}

// cronStatus is the runtime's report of the jobs in spec, in spec's order: a
// job gone from spec (a push removed it) loses its history, so status.cron
// stays as bounded as spec.cron (50 jobs).
func cronStatus(jobs []appv1.CronJob, got []runtime.CronStatus) []appv1.CronJobStatus {
	if len(jobs) == 0 {
		return nil
	}
	by := make(map[string]runtime.CronStatus, len(got))
	for _, c := range got {
		by[c.ID] = c
	}
	var out []appv1.CronJobStatus
	for _, j := range jobs {
		if c, ok := by[j.ID]; ok {
			out = append(out, *c.DeepCopy())
		}
	}
	return out
}

// setCronCondition reports the cron jobs that keep failing
// (appv1.CronFailingThreshold runs in a row). It is its own condition and never
// touches Ready or the phase: a nightly job that fails says nothing of whether
// the web processes serve, and an agent deciding on a rollout must not see a
// serving app as Failed because of it; apps:info and app_status show it beside.
func setCronCondition(app *appv1.App) {
	if len(app.Spec.Cron) == 0 {
		meta.RemoveStatusCondition(&app.Status.Conditions, appv1.CronHealthyCondition)
		return
	}
	cmd := map[string]string{}
	for _, j := range app.Spec.Cron {
		cmd[j.ID] = j.Command
	}
	var failing []string
	for _, c := range app.Status.Cron {
		if c.ConsecutiveFailures < appv1.CronFailingThreshold {
			continue
		}
		exit := "none"
		if c.LastExitCode != nil {
			exit = fmt.Sprint(*c.LastExitCode)
		}
		command := cmd[c.ID]
		if len(command) > 80 {
			command = command[:77] + "..."
		}
		failing = append(failing, fmt.Sprintf("cron job %s (%q) failed %d times in a row, last exit %s", c.ID, command, c.ConsecutiveFailures, exit))
	}
	c := metav1.Condition{Type: appv1.CronHealthyCondition, ObservedGeneration: app.Generation,
		Status: metav1.ConditionTrue, Reason: appv1.CronJobsHealthyReason, Message: "No cron job keeps failing."}
	if len(failing) > 0 {
		c.Status, c.Reason = metav1.ConditionFalse, appv1.CronJobFailingReason
		c.Message = strings.Join(failing, "; ") + "."
	}
	meta.SetStatusCondition(&app.Status.Conditions, c)
}

// beforeLogLines is msg with more of the deployer's words added to its first
// line: the lines after it, when there are any, are what the app printed last
// ("...; last log lines:" and the lines), and whoever shows them to an agent
// frames everything after the first line as the app's output, so the
// deployer's own words must not follow them.
func beforeLogLines(msg, more string) string {
	head, lines, ok := strings.Cut(msg, "\n")
	if !ok {
		return msg + more
	}
	if h, cut := strings.CutSuffix(head, "; last log lines:"); cut {
		return h + "." + more + " Its last log lines:\n" + lines
	}
	return head + more + "\n" + lines
}
