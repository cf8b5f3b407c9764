package sshcmd

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

func (s *session) imageCommands() []*cobra.Command {
	deploy := newCmd(groupRun, "deploy:image APP IMAGE", "Deploy an image from a registry (a tag or a digest) as a new release, as a push deploys a build", args(2, 2), func(_ *cobra.Command, a []string) error {
		res, err := s.b.DeployImage(s.ctx, s.user, a[0], a[1], s.errOut)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "v%d serves at %s\n", res.Release, res.URL)
		return nil
	})

	var passwordStdin bool
	login := newCmd(groupSystem, "registry:login HOST USER --password-stdin", "Keep a registry login that deploy:image pulls private images with, for every app (admins)", args(2, 2), func(_ *cobra.Command, a []string) error {
		if !passwordStdin {
			return fail("registry:login: give the password (or a token) on stdin with --password-stdin: echo TOKEN | ssh bex@HOST registry:login %s %s --password-stdin", a[0], a[1])
		}
		pw, err := io.ReadAll(io.LimitReader(s.stdin, 4097))
		if err != nil {
			return err
		}
		out, err := s.b.RegistryLogin(s.ctx, s.user, a[0], a[1], strings.TrimRight(string(pw), "\r\n"))
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Logged in to %s as %s: deploy:image pulls from it with this login; the password is kept in a Secret, never shown.\n", out.Host, a[1])
		return nil
	})
	flags(login).BoolVar(&passwordStdin, "password-stdin", false, "read the password (or token) from stdin; it is never shown or logged")

	logout := newCmd(groupSystem, "registry:logout HOST", "Forget a registry login (admins)", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.RegistryLogout(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Logged out of %s: deploy:image pulls from it anonymously.\n", out.Host)
		return nil
	})

	var asJSON bool
	list := newCmd(groupSystem, "registry", "List the registry logins deploy:image pulls with, without passwords (admins)", args(0, 0), func(*cobra.Command, []string) error {
		out, err := s.b.Registries(s.ctx, s.user)
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out.Logins)
		}
		if len(out.Logins) == 0 {
			fmt.Fprintln(s.out, "No registry logins: registry:login HOST USER --password-stdin keeps one.")
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "HOST\tUSER")
		for _, l := range out.Logins {
			fmt.Fprintf(w, "%s\t%s\n", l.Host, l.Username)
		}
		return w.Flush()
	})
	jsonFlag(list, &asJSON)
	return []*cobra.Command{deploy, login, logout, list}
}
