package sshcmd

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/backend"
)

func (s *session) webhookCommands() []*cobra.Command {
	var infoJSON bool
	info := newCmd(groupConfig, "webhooks APP", "Show an app's webhook: its URL, whether a secret is set, what it deploys", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.Webhook(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if infoJSON {
			return s.json(out)
		}
		w := s.table()
		url := out.URL
		if url == "" {
			url = "(this server serves no webhooks: start bex gitserver with --hooks-addr)"
		}
		secret := "not set: webhooks:secret " + out.App + " makes one"
		if out.SecretSet {
			secret = "set"
			if out.PreviousValidUntil != nil {
				secret += fmt.Sprintf(" (the previous one verifies too until %s)", out.PreviousValidUntil.Format(time.RFC3339))
			}
		}
		upstream := "none: a delivery rebuilds the current commit"
		if out.Upstream != "" {
			upstream = out.Upstream + " (fetched on each delivery)"
		}
		rows := [][2]string{{"URL", url}, {"Secret", secret}, {"Deploys", "pushes to " + out.Ref}, {"Upstream", upstream},
			{"Content type", "application/json; events: push (ping answers)"}}
		if out.UpstreamUsername != "" {
			rows = append(rows, [2]string{"Credentials", "username " + out.UpstreamUsername + " (the password is kept, never shown)"})
		}
		if out.DeployKey != "" {
			rows = append(rows, [2]string{"Deploy key", out.DeployKey + " (for ssh upstreams: add it to the git host, read-only)"})
		}
		for _, r := range rows {
			fmt.Fprintf(w, "%s:\t%s\n", r[0], r[1])
		}
		return w.Flush()
	})
	jsonFlag(info, &infoJSON)

	var drop, secretJSON bool
	secret := newCmd(groupConfig, "webhooks:secret APP [--drop-previous]", "Make or rotate an app's webhook secret (printed once)", args(1, 1), func(_ *cobra.Command, a []string) error {
		if drop {
			if err := s.b.DropPreviousWebhookSecret(s.ctx, s.user, a[0]); err != nil {
				return err
			}
			fmt.Fprintf(s.out, "The previous webhook secret of %s no longer verifies.\n", a[0])
			return nil
		}
		out, err := s.b.RotateWebhookSecret(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if secretJSON {
			return s.json(out)
		}
		fmt.Fprintln(s.out, out.Secret)
		fmt.Fprintf(s.errOut, "The webhook secret of %s: shown this once. Set it in the git host's webhook settings", out.App)
		if out.URL != "" {
			fmt.Fprintf(s.errOut, " with the URL %s", out.URL)
		}
		fmt.Fprintln(s.errOut, ".")
		if out.PreviousValidUntil != nil {
			fmt.Fprintf(s.errOut, "The previous secret verifies too until %s, or until webhooks:secret %s --drop-previous.\n", out.PreviousValidUntil.Format(time.RFC3339), out.App)
		}
		return nil
	})
	flags(secret).BoolVar(&drop, "drop-previous", false, "stop accepting the secret the last rotation replaced, now")
	jsonFlag(secret, &secretJSON)

	var unset, passwordStdin bool
	var username string
	upstream := newCmd(groupConfig, "webhooks:upstream APP [URL] [--username USER --password-stdin] [--unset]", "Set where a webhook delivery fetches the app's code from (or --unset: rebuild the current commit)", args(1, 2), func(_ *cobra.Command, a []string) error {
		if unset == (len(a) == 2) {
			return fail("webhooks:upstream: give a URL (https://, ssh://, git@host:path or file:///), or --unset")
		}
		if (username != "") != passwordStdin {
			return fail("webhooks:upstream: --username and --password-stdin go together (the password, or a token, on stdin)")
		}
		url := ""
		if !unset {
			url = a[1]
		}
		var creds *backend.UpstreamCredentials
		if passwordStdin {
			pw, err := io.ReadAll(io.LimitReader(s.stdin, 4097))
			if err != nil {
				return err
			}
			creds = &backend.UpstreamCredentials{Username: username, Password: strings.TrimRight(string(pw), "\r\n")}
		}
		out, err := s.b.SetUpstream(s.ctx, s.user, a[0], url, creds)
		if err != nil {
			return err
		}
		if url == "" {
			fmt.Fprintf(s.out, "%s has no upstream: a webhook delivery rebuilds its current commit.\n", a[0])
			return nil
		}
		fmt.Fprintf(s.out, "A webhook delivery for %s fetches %s, builds the deploy branch's commit and moves it once it serves.\n", a[0], url)
		if out.Credentials {
			fmt.Fprintf(s.out, "It authenticates as %s; the password is kept in a Secret, never shown.\n", username)
		}
		if out.DeployKey != "" {
			fmt.Fprintf(s.out, "It fetches with the deploy key of %s; add it to the git host (read-only):\n%s\n", a[0], out.DeployKey)
		}
		if !out.HasSecret {
			fmt.Fprintf(s.errOut, "%s has no webhook secret yet: webhooks:secret %s makes one.\n", a[0], a[0])
		}
		return nil
	})
	flags(upstream).BoolVar(&unset, "unset", false, "remove the upstream: deliveries rebuild the current commit")
	flags(upstream).StringVar(&username, "username", "", "the username an https upstream is fetched with (kept in a Secret with the password)")
	flags(upstream).BoolVar(&passwordStdin, "password-stdin", false, "read the upstream's password (or token) from stdin; it is never shown or logged")

	var rotate, keyJSON bool
	deployKey := newCmd(groupConfig, "webhooks:deploy-key APP [--rotate]", "Print an app's deploy key, the key its ssh upstreams are fetched with (--rotate: make a new one)", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.DeployKey(s.ctx, s.user, a[0], rotate)
		if err != nil {
			return err
		}
		if keyJSON {
			return s.json(out)
		}
		fmt.Fprintln(s.out, out.DeployKey)
		if out.Rotated {
			fmt.Fprintf(s.errOut, "The new deploy key of %s: replace the old one on the git host; the old one no longer fetches.\n", out.App)
		}
		return nil
	})
	flags(deployKey).BoolVar(&rotate, "rotate", false, "replace the deploy key with a new one; the old one stops fetching at once")
	jsonFlag(deployKey, &keyJSON)
	return []*cobra.Command{info, secret, upstream, deployKey}
}
