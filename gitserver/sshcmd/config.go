package sshcmd

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

const maxEnvValue = 32768

func checkEnvName(k string) error {
	if len(k) > 256 || !envNameRE.MatchString(k) {
		return fail("%q is not a config var name: use letters, digits and '_', not starting with a digit (as a shell variable)", k)
	}
	return nil
}

// ConfigVar is one config var in `config --json` and `config:get --json`: a literal
// value, or a reference to a Secret key (whose value is not shown).
type ConfigVar struct {
	Name   string     `json:"name"`
	Value  *string    `json:"value,omitempty"`
	Secret *SecretRef `json:"secret,omitempty"`
}

// SecretRef names a key of a Secret in the app's namespace.
type SecretRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// ConfigList is `config --json`.
type ConfigList struct {
	App    string      `json:"app"`
	Config []ConfigVar `json:"config"`
}

func configVar(e appv1.EnvVar) ConfigVar {
	if e.ValueFrom != nil {
		return ConfigVar{Name: e.Name, Secret: &SecretRef{Name: e.ValueFrom.Name, Key: e.ValueFrom.Key}}
	}
	v := e.Value
	return ConfigVar{Name: e.Name, Value: &v}
}

func (s *session) configCommands() []*cobra.Command {
	var listJSON bool
	list := newCmd(groupConfig, "config APP", "Show an app's config vars", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		out := ConfigList{App: app.Name, Config: []ConfigVar{}}
		for _, e := range app.Spec.Env {
			out.Config = append(out.Config, configVar(e))
		}
		if listJSON {
			return s.json(out)
		}
		if len(out.Config) == 0 {
			fmt.Fprintf(s.out, "%s has no config vars: config:set %s KEY=VALUE sets one.\n", app.Name, app.Name)
		}
		for _, v := range out.Config {
			if v.Secret != nil {
				fmt.Fprintf(s.out, "%s  # from secret %s, key %s\n", v.Name, v.Secret.Name, v.Secret.Key)
				continue
			}
			// Quoted as config:set takes it back: the line can be pasted.
			fmt.Fprintf(s.out, "%s=%s\n", v.Name, shellQuote(*v.Value))
		}
		return nil
	})
	jsonFlag(list, &listJSON)

	var getJSON bool
	get := newCmd(groupConfig, "config:get APP KEY", "Print one config var's value, exactly", args(2, 2), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		if err := checkEnvName(a[1]); err != nil {
			return err
		}
		i := slices.IndexFunc(app.Spec.Env, func(e appv1.EnvVar) bool { return e.Name == a[1] })
		if i < 0 {
			return fail("%s is not set on %s (config %s lists what is)", a[1], app.Name, app.Name)
		}
		v := configVar(app.Spec.Env[i])
		if getJSON {
			return s.json(v)
		}
		if v.Secret != nil {
			return fail("%s of %s comes from secret %s, key %s: its value is not shown", a[1], app.Name, v.Secret.Name, v.Secret.Key)
		}
		fmt.Fprintln(s.out, *v.Value)
		return nil
	})
	jsonFlag(get, &getJSON)

	var setDetach bool
	set := newCmd(groupConfig, "config:set APP KEY=VALUE...", "Set config vars: one release, one restart", args(2, -1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		type pair struct{ k, v string }
		var pairs []pair
		var names []string
		for _, kv := range a[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fail("%q is not KEY=VALUE: quote a value with blanks, e.g. config:set %s 'KEY=a b'", kv, app.Name)
			}
			if err := checkEnvName(k); err != nil {
				return err
			}
			if len(v) > maxEnvValue {
				return fail("the value of %s is %d bytes; at most %d fit", k, len(v), maxEnvValue)
			}
			pairs = append(pairs, pair{k, v})
			if !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
		edit := func(env []appv1.EnvVar) []appv1.EnvVar {
			for _, p := range pairs {
				if i := slices.IndexFunc(env, func(e appv1.EnvVar) bool { return e.Name == p.k }); i >= 0 {
					env[i] = appv1.EnvVar{Name: p.k, Value: p.v}
				} else {
					env = append(env, appv1.EnvVar{Name: p.k, Value: p.v})
				}
			}
			return env
		}
		return s.changeConfig(app, edit, "Set "+strings.Join(names, ", "), "config:set", names, setDetach)
	})
	flags(set).BoolVar(&setDetach, "detach", false, "return once the release is recorded, without waiting for it to serve")

	var unsetDetach bool
	unset := newCmd(groupConfig, "config:unset APP KEY...", "Remove config vars: one release, one restart", args(2, -1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		var names []string
		for _, k := range a[1:] {
			if err := checkEnvName(k); err != nil {
				return err
			}
			if !slices.ContainsFunc(app.Spec.Env, func(e appv1.EnvVar) bool { return e.Name == k }) {
				fmt.Fprintf(s.errOut, "%s is not set on %s\n", k, app.Name)
				continue
			}
			names = append(names, k)
		}
		if len(names) == 0 {
			fmt.Fprintln(s.out, "Nothing to change.")
			return nil
		}
		edit := func(env []appv1.EnvVar) []appv1.EnvVar {
			return slices.DeleteFunc(env, func(e appv1.EnvVar) bool { return slices.Contains(names, e.Name) })
		}
		return s.changeConfig(app, edit, "Unset "+strings.Join(names, ", "), "config:unset", names, unsetDetach)
	})
	flags(unset).BoolVar(&unsetDetach, "detach", false, "return once the release is recorded, without waiting for it to serve")
	return append([]*cobra.Command{list, get, set, unset}, s.domainCommands()...)
}

// changeConfig records a new release of app (cause Config) whose config vars are
// edit of the current ones, or, before the app's first deploy, edits the spec for
// the first release to take. Then it waits for the release to serve unless detach.
// edit runs on the App as read for the write, so concurrent changes are not lost.
func (s *session) changeConfig(app *appv1.App, edit func([]appv1.EnvVar) []appv1.EnvVar, desc, command string, names []string, detach bool) error {
	n, err := s.ops.ChangeConfig(s.ctx, s.user, app, edit, desc)
	if err != nil {
		return err
	}
	if n == 0 {
		s.audit(command, app.Name, "vars", names)
		fmt.Fprintf(s.out, "%s on %s; the first deploy (git push) takes it.\n", desc, app.Name)
		return nil
	}
	s.audit(command, app.Name, "vars", names, "release", n)
	fmt.Fprintf(s.out, "%s on %s: release v%d.\n", desc, app.Name, n)
	return s.await(app.Name, n, detach)
}

// await waits for release n of app to serve, with progress on stderr, unless detach.
func (s *session) await(app string, n int64, detach bool) error {
	if detach {
		fmt.Fprintf(s.out, "Not waiting for v%d to serve (apps:info %s shows how it goes).\n", n, app)
		return nil
	}
	fmt.Fprintf(s.errOut, "-----> Waiting for v%d to serve\n", n)
	url, err := s.ops.Await(s.ctx, app, n, s.cfg.RolloutTimeout, func(msg string) { fmt.Fprintf(s.errOut, "       %s\n", msg) })
	if err != nil {
		return err
	}
	fmt.Fprintf(s.out, "v%d serves at %s\n", n, url)
	return nil
}

// shellQuote quotes v for a POSIX shell when it needs it, so that a printed
// KEY=VALUE can be given back to config:set as it is.
func shellQuote(v string) string {
	if v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/@%+=") == "" {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}
