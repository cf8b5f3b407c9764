package sshcmd

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
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
		if out.DeployKey != "" && (strings.HasPrefix(out.Upstream, "ssh://") || strings.HasPrefix(out.Upstream, "git@")) {
			rows = append(rows, [2]string{"Deploy key", out.DeployKey})
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

	var unset bool
	upstream := newCmd(groupConfig, "webhooks:upstream APP [URL] [--unset]", "Set where a webhook delivery fetches the app's code from (or --unset: rebuild the current commit)", args(1, 2), func(_ *cobra.Command, a []string) error {
		if unset == (len(a) == 2) {
			return fail("webhooks:upstream: give a URL (https://, ssh://, git@host:path or file:///), or --unset")
		}
		url := ""
		if !unset {
			url = a[1]
		}
		hasSecret, err := s.b.SetUpstream(s.ctx, s.user, a[0], url)
		if err != nil {
			return err
		}
		if url == "" {
			fmt.Fprintf(s.out, "%s has no upstream: a webhook delivery rebuilds its current commit.\n", a[0])
			return nil
		}
		fmt.Fprintf(s.out, "A webhook delivery for %s fetches %s, builds the deploy branch's commit and moves it once it serves.\n", a[0], url)
		if !hasSecret {
			fmt.Fprintf(s.errOut, "%s has no webhook secret yet: webhooks:secret %s makes one.\n", a[0], a[0])
		}
		return nil
	})
	flags(upstream).BoolVar(&unset, "unset", false, "remove the upstream: deliveries rebuild the current commit")
	return []*cobra.Command{info, secret, upstream}
}
