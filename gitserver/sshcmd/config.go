package sshcmd

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/backend"
)

func (s *session) configCommands() []*cobra.Command {
	var listJSON bool
	list := newCmd(groupConfig, "config APP", "Show an app's config vars", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.Config(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if listJSON {
			return s.json(out)
		}
		if len(out.Config) == 0 {
			fmt.Fprintf(s.out, "%s has no config vars: config:set %s KEY=VALUE sets one.\n", out.App, out.App)
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
		v, err := s.b.ConfigVar(s.ctx, s.user, a[0], a[1])
		if err != nil {
			return err
		}
		if getJSON {
			return s.json(v)
		}
		if v.Secret != nil {
			return fail("%s of %s comes from secret %s, key %s: its value is not shown", a[1], a[0], v.Secret.Name, v.Secret.Key)
		}
		fmt.Fprintln(s.out, *v.Value)
		return nil
	})
	jsonFlag(get, &getJSON)

	var setDetach, setEncoded bool
	set := newCmd(groupConfig, "config:set APP KEY=VALUE...", "Set config vars: one release, one restart", args(2, -1), func(_ *cobra.Command, a []string) error {
		var ch backend.ConfigChange
		for _, kv := range a[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fail("%q is not KEY=VALUE: quote a value with blanks, e.g. config:set %s 'KEY=a b'", kv, a[0])
			}
			if setEncoded {
				dec, err := decodeValue(v)
				if err != nil {
					return fail("the value of %s is not base64 (--encoded): %v; encode it with: printf %%s 'VALUE' | base64 -w0", k, err)
				}
				v = dec
			}
			ch.Set = append(ch.Set, backend.EnvVar{Name: k, Value: v})
		}
		return s.changeConfig(a[0], ch, setDetach)
	})
	flags(set).BoolVar(&setDetach, "detach", false, "return once the release is recorded, without waiting for it to serve")
	flags(set).BoolVar(&setEncoded, "encoded", false, "the values are base64 (standard alphabet, as base64(1) writes it), for newlines and quotes that ssh's command line mangles, as Dokku's config:set --encoded")

	var unsetDetach bool
	unset := newCmd(groupConfig, "config:unset APP KEY...", "Remove config vars: one release, one restart", args(2, -1), func(_ *cobra.Command, a []string) error {
		return s.changeConfig(a[0], backend.ConfigChange{Unset: a[1:]}, unsetDetach)
	})
	flags(unset).BoolVar(&unsetDetach, "detach", false, "return once the release is recorded, without waiting for it to serve")
	return append([]*cobra.Command{list, get, set, unset}, s.domainCommands()...)
}

// changeConfig makes the change and, unless detach, waits for its release to
// serve.
func (s *session) changeConfig(app string, ch backend.ConfigChange, detach bool) error {
	ch.Progress = s.errOut // the release command's output
	res, err := s.b.ChangeConfig(s.ctx, s.user, app, ch)
	if err != nil {
		return err
	}
	for _, k := range res.NotSet {
		fmt.Fprintf(s.errOut, "%s is not set on %s\n", k, app)
	}
	switch {
	case res.Description == "":
		fmt.Fprintln(s.out, "Nothing to change.")
		return nil
	case res.Release == 0:
		fmt.Fprintf(s.out, "%s on %s; the first deploy (git push) takes it.\n", res.Description, app)
		return nil
	}
	fmt.Fprintf(s.out, "%s on %s: release v%d.\n", res.Description, app, res.Release)
	return s.await(app, res.Release, detach)
}

// await waits for release n of app to serve, with progress on stderr, unless detach.
func (s *session) await(app string, n int64, detach bool) error {
	if detach {
		fmt.Fprintf(s.out, "Not waiting for v%d to serve (apps:info %s shows how it goes).\n", n, app)
		return nil
	}
	fmt.Fprintf(s.errOut, "-----> Waiting for v%d to serve\n", n)
	url, err := s.b.Await(s.ctx, app, n, func(msg string) { fmt.Fprintf(s.errOut, "       %s\n", msg) })
	if err != nil {
		return err
	}
	fmt.Fprintf(s.out, "v%d serves at %s\n", n, url)
	return nil
}

// decodeValue decodes a value of config:set --encoded: base64 as base64(1) writes
// it, whose lines a shell's $(...) keeps (blanks are dropped), padded or not.
func decodeValue(v string) (string, error) {
	v = strings.Join(strings.Fields(v), "")
	enc := base64.StdEncoding
	if !strings.HasSuffix(v, "=") && len(v)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	b, err := enc.DecodeString(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// shellQuote quotes v for a POSIX shell when it needs it, so that a printed
// KEY=VALUE can be given back to config:set as it is.
func shellQuote(v string) string {
	if v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/@%+=") == "" {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}
