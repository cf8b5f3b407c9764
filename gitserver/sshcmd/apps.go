package sshcmd

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/appops"
	"bex.co/bex/gitserver/webhook/secrets"
)

func checkAppName(name string) error { return appops.CheckAppName(name) }

// canAccess reports whether the session's user may use app (appops.CanAccess).
func (s *session) canAccess(app *appv1.App) bool { return appops.CanAccess(s.user, app) }

// app reads an app the user may use, from the cache.
func (s *session) app(name string) (*appv1.App, error) { return s.ops.App(s.ctx, s.user, name) }

func (s *session) key(app string) client.ObjectKey {
	return client.ObjectKey{Namespace: s.cfg.Namespace, Name: app}
}

func (s *session) requireAdmin(what string) error {
	if !s.user.Admin {
		return fail("%s is for admins, and %s is not one: ask an admin", what, s.user.Name)
	}
	return nil
}

// updateApp changes app through the API server and waits until the cache has the
// change (appops.Ops.Update).
func (s *session) updateApp(name string, change func(*appv1.App) error) (*appv1.App, error) {
	return s.ops.Update(s.ctx, s.user, name, change)
}

// waitCached waits until the cached app satisfies done (appops.Ops.WaitCached).
func (s *session) waitCached(name string, done func(*appv1.App) bool) error {
	return s.ops.WaitCached(s.ctx, name, done)
}

// AppSummary is one app of `apps:list --json`.
type AppSummary struct {
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Revision  int64  `json:"revision"`
	URL       string `json:"url"`
	Suspended bool   `json:"suspended"`
}

// AppInfo is `apps:info --json`.
type AppInfo struct {
	Name         string          `json:"name"`
	Phase        string          `json:"phase"`
	Release      int64           `json:"release"`
	Revision     int64           `json:"revision"`
	URL          string          `json:"url"`
	Image        string          `json:"image"`
	Suspended    bool            `json:"suspended"`
	DeployBranch string          `json:"deployBranch"`
	GitURL       string          `json:"gitURL"`
	Members      []string        `json:"members"`
	Domains      []string        `json:"domains"`
	Processes    []ProcessInfo   `json:"processes"`
	Conditions   []ConditionInfo `json:"conditions"`
	Created      time.Time       `json:"created"`
}

// ConditionInfo is one status condition of an app.
type ConditionInfo struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func summary(a *appv1.App) AppSummary {
	return AppSummary{Name: a.Name, Phase: phase(a), Revision: a.Status.Revision, URL: a.Status.URL, Suspended: a.Spec.Suspended}
}

func phase(a *appv1.App) string {
	if a.Status.Phase == "" {
		return string(appv1.AppPhasePending)
	}
	return string(a.Status.Phase)
}

func (s *session) appCommands() []*cobra.Command {
	var asJSON bool
	create := newCmd(groupApps, "apps:create NAME", "Create an app (then: git push)", args(1, 1), func(_ *cobra.Command, a []string) error {
		name := a[0]
		if err := checkAppName(name); err != nil {
			return err
		}
		if !s.user.Admin && !s.user.CanCreateApps {
			return fail("user %s may not create apps: ask an admin to create %s and run access:add %s %s", s.user.Name, name, name, s.user.Name)
		}
		app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.cfg.Namespace},
			Spec: appv1.AppSpec{Members: []string{s.user.Name}}}
		if err := s.cfg.Client.Create(s.ctx, app); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return fail("app %s exists already: pick another name", name)
			}
			return fmt.Errorf("creating app %s: %w", name, err)
		}
		s.audit("apps:create", name)
		if err := s.waitCached(name, func(c *appv1.App) bool { return c != nil && c.UID == app.UID }); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Created app %s. Deploy it with:\n  git remote add bex %s/%s\n  git push bex main\n", name, s.cfg.Host, name)
		return nil
	})

	list := newCmd(groupApps, "apps:list", "List the apps you can use", args(0, 0), func(*cobra.Command, []string) error {
		var apps appv1.AppList
		if err := s.cfg.Reader.List(s.ctx, &apps, client.InNamespace(s.cfg.Namespace)); err != nil {
			return fmt.Errorf("listing apps: %w", err)
		}
		out := []AppSummary{}
		for i := range apps.Items {
			if s.canAccess(&apps.Items[i]) {
				out = append(out, summary(&apps.Items[i]))
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		if asJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintln(s.out, "No apps yet: apps:create NAME, or git push to a new name.")
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "NAME\tPHASE\tRELEASE\tURL")
		for _, a := range out {
			rev := "-"
			if a.Revision > 0 {
				rev = fmt.Sprintf("v%d", a.Revision)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", a.Name, a.Phase, rev, a.URL)
		}
		return w.Flush()
	})
	list.Aliases = []string{"apps"}
	jsonFlag(list, &asJSON)

	var infoJSON bool
	info := newCmd(groupApps, "apps:info APP", "Show an app", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		in := AppInfo{Name: app.Name, Phase: phase(app), Release: app.Spec.Release, Revision: app.Status.Revision, URL: app.Status.URL,
			Image: app.Spec.Image, Suspended: app.Spec.Suspended, DeployBranch: app.Spec.Git.DeployBranch,
			GitURL: s.cfg.Host + "/" + app.Name, Members: nonNil(app.Spec.Members), Domains: nonNil(app.Spec.Domains),
			Processes: processes(app), Conditions: []ConditionInfo{}, Created: app.CreationTimestamp.UTC()}
		for _, c := range app.Status.Conditions {
			in.Conditions = append(in.Conditions, ConditionInfo{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message})
		}
		if infoJSON {
			return s.json(in)
		}
		w := s.table()
		rows := [][2]string{
			{"Name", in.Name}, {"Phase", in.Phase}, {"URL", in.URL}, {"Git", in.GitURL},
			{"Release", fmt.Sprintf("v%d (serving: v%d)", in.Release, in.Revision)},
			{"Image", in.Image}, {"Deploy branch", in.DeployBranch},
			{"Suspended", fmt.Sprint(in.Suspended)},
			{"Members", strings.Join(in.Members, ", ")}, {"Domains", strings.Join(in.Domains, ", ")},
			{"Created", in.Created.Format(time.RFC3339)},
		}
		for _, p := range in.Processes {
			rows = append(rows, [2]string{"Process " + p.Type, fmt.Sprintf("%d × %s (%s)", p.Replicas, commandLine(p.Command), limitsLine(p.Resources))})
		}
		if c := meta.FindStatusCondition(app.Status.Conditions, appv1.RolledOutCondition); c != nil && c.Status != metav1.ConditionTrue && c.Message != "" {
			rows = append(rows, [2]string{"Rollout", c.Message})
		}
		for _, r := range rows {
			fmt.Fprintf(w, "%s:\t%s\n", r[0], r[1])
		}
		return w.Flush()
	})
	jsonFlag(info, &infoJSON)

	var confirm string
	destroy := newCmd(groupApps, "apps:destroy APP --confirm APP", "Delete an app, its processes, releases and repository", args(1, 1), func(_ *cobra.Command, a []string) error {
		name := a[0]
		app, err := s.app(name)
		if err != nil {
			return err
		}
		if confirm != name {
			return fail("this deletes %s for good: to go on, run apps:destroy %s --confirm %s", name, name, name)
		}
		// The webhook Secret first, while a failure can still be retried: in the
		// secrets namespace it has no owner reference (none crosses namespaces), and
		// the deployer, which finalizes the App, may read no Secrets; under bex up no
		// garbage collector acts on owner references either.
		if err := secrets.Delete(s.ctx, s.cfg.Client, s.cfg.SecretsNamespace, app); err != nil {
			return fmt.Errorf("deleting the webhook secret of %s: %w", name, err)
		}
		if s.cfg.RemoveRepository != nil {
			if err := s.cfg.RemoveRepository(s.ctx, name); err != nil {
				return fail("%v", err)
			}
		}
		err = s.cfg.Client.Delete(s.ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.cfg.Namespace}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting app %s: %w", name, err)
		}
		s.audit("apps:destroy", name)
		// The deployer stops the processes (its finalizer) before the App goes.
		fmt.Fprintf(s.out, "Destroyed %s: its processes stop and its releases go with it.\n", name)
		return nil
	})
	flags(destroy).StringVar(&confirm, "confirm", "", "the app's name again, to confirm")

	var whoJSON bool
	who := newCmd(groupAccess, "whoami", "Show who you are to this server", args(0, 0), func(*cobra.Command, []string) error {
		role := string(appv1.RoleMember)
		if s.user.Admin {
			role = string(appv1.RoleAdmin)
		}
		me := WhoAmI{Name: s.user.Name, Role: role, CanCreateApps: s.user.Admin || s.user.CanCreateApps, Key: s.user.KeyName, Fingerprint: s.fp}
		if whoJSON {
			return s.json(me)
		}
		fmt.Fprintf(s.out, "%s (%s), key %s %s\n", me.Name, me.Role, me.Key, me.Fingerprint)
		return nil
	})
	jsonFlag(who, &whoJSON)
	return []*cobra.Command{create, list, info, destroy, who}
}

// WhoAmI is `whoami --json`.
type WhoAmI struct {
	Name          string `json:"name"`
	Role          string `json:"role"`
	CanCreateApps bool   `json:"canCreateApps"`
	Key           string `json:"key"`
	Fingerprint   string `json:"fingerprint"`
}

// AccessList is `access:list --json`.
type AccessList struct {
	App     string   `json:"app"`
	Members []string `json:"members"`
}

func (s *session) accessCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupAccess, "access:list APP", "List who may use an app besides admins", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(AccessList{App: app.Name, Members: nonNil(app.Spec.Members)})
		}
		if len(app.Spec.Members) == 0 {
			fmt.Fprintf(s.out, "Only admins may use %s.\n", app.Name)
		}
		for _, m := range app.Spec.Members {
			fmt.Fprintln(s.out, m)
		}
		return nil
	})
	jsonFlag(list, &asJSON)

	add := newCmd(groupAccess, "access:add APP USER", "Let a user push to and manage an app", args(2, 2), func(_ *cobra.Command, a []string) error {
		name, user := a[0], a[1]
		u := &appv1.User{}
		if err := s.cfg.Reader.Get(s.ctx, client.ObjectKey{Name: user}, u); err != nil {
			if apierrors.IsNotFound(err) {
				return fail("no user %q: an admin creates users with users:add", user)
			}
			return err
		}
		_, err := s.updateApp(name, func(app *appv1.App) error {
			if slices.Contains(app.Spec.Members, user) {
				return fail("%s has access to %s already", user, name)
			}
			app.Spec.Members = append(app.Spec.Members, user)
			return nil
		})
		if err != nil {
			return err
		}
		s.audit("access:add", name, "member", user)
		fmt.Fprintf(s.out, "%s may now use %s.\n", user, name)
		return nil
	})

	remove := newCmd(groupAccess, "access:remove APP USER", "Take away a user's access to an app", args(2, 2), func(_ *cobra.Command, a []string) error {
		name, user := a[0], a[1]
		_, err := s.updateApp(name, func(app *appv1.App) error {
			if !slices.Contains(app.Spec.Members, user) {
				return fail("%s is not a member of %s (access:list %s shows who is)", user, name, name)
			}
			app.Spec.Members = slices.DeleteFunc(app.Spec.Members, func(m string) bool { return m == user })
			return nil
		})
		if err != nil {
			return err
		}
		s.audit("access:remove", name, "member", user)
		fmt.Fprintf(s.out, "%s may no longer use %s.\n", user, name)
		return nil
	})
	return []*cobra.Command{list, add, remove}
}

func (s *session) json(v any) error {
	enc := json.NewEncoder(s.out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (s *session) table() *tabwriter.Writer {
	return tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
