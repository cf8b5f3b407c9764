package sshcmd

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/appops"
	"bex.co/bex/gitserver/webhook/secrets"
)

// WebhookInfo is `webhooks APP --json`.
type WebhookInfo struct {
	App string `json:"app"`
	// URL is where the git host posts; empty when this server serves no webhooks.
	URL       string `json:"url"`
	SecretSet bool   `json:"secretSet"`
	// PreviousValidUntil is when the secret a rotation replaced stops verifying.
	PreviousValidUntil *time.Time `json:"previousValidUntil,omitempty"`
	// Ref is the deploy branch's full ref: only pushes to it redeploy.
	Ref string `json:"ref"`
	// Upstream is fetched on each delivery; empty: the current commit is rebuilt.
	Upstream string `json:"upstream"`
	// DeployKey is the key bex fetches ssh upstreams with, to add as a read-only
	// deploy key on the git host.
	DeployKey string `json:"deployKey,omitempty"`
}

// WebhookSecret is `webhooks:secret APP --json`.
type WebhookSecret struct {
	App    string `json:"app"`
	URL    string `json:"url"`
	Secret string `json:"secret"`
	// PreviousValidUntil is when the secret replaced stops verifying; absent for a
	// first secret.
	PreviousValidUntil *time.Time `json:"previousValidUntil,omitempty"`
}

func (s *session) secretStore() *secrets.Store {
	return &secrets.Store{Apps: s.cfg.Reader, Secrets: s.cfg.Client, Namespace: s.cfg.Namespace, SecretsNamespace: s.cfg.SecretsNamespace}
}

func (s *session) hookURL(app string) string {
	if s.cfg.HooksURL == "" {
		return ""
	}
	return strings.TrimSuffix(s.cfg.HooksURL, "/") + "/hooks/" + app
}

func (s *session) webhookCommands() []*cobra.Command {
	var infoJSON bool
	info := newCmd(groupConfig, "webhooks APP", "Show an app's webhook: its URL, whether a secret is set, what it deploys", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		st, err := s.secretStore().Get(s.ctx, app.Spec.Git.WebhookSecretRef)
		if err != nil {
			return err
		}
		out := WebhookInfo{App: app.Name, URL: s.hookURL(app.Name), SecretSet: st.Set, Ref: "refs/heads/" + deployBranch(app), Upstream: app.Spec.Git.Upstream}
		if !st.PreviousUntil.IsZero() {
			t := st.PreviousUntil.UTC()
			out.PreviousValidUntil = &t
		}
		if s.cfg.DeployKey != nil {
			out.DeployKey = s.cfg.DeployKey()
		}
		if infoJSON {
			return s.json(out)
		}
		w := s.table()
		url := out.URL
		if url == "" {
			url = "(this server serves no webhooks: start bex gitserver with --hooks-addr)"
		}
		secret := "not set: webhooks:secret " + app.Name + " makes one"
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
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		if drop {
			ref := app.Spec.Git.WebhookSecretRef
			if ref == nil {
				return fail("%s has no webhook secret: webhooks:secret %s makes one", app.Name, app.Name)
			}
			if err := secrets.DropPrevious(s.ctx, s.cfg.Client, s.cfg.SecretsNamespace, ref); err != nil {
				if errors.Is(err, secrets.ErrNoPrevious) {
					return fail("%s has no previous webhook secret to drop", app.Name)
				}
				return err
			}
			s.audit("webhooks:secret", app.Name, "dropPrevious", true)
			fmt.Fprintf(s.out, "The previous webhook secret of %s no longer verifies.\n", app.Name)
			return nil
		}
		ref := app.Spec.Git.WebhookSecretRef
		if ref == nil {
			ref = secrets.DefaultRef(app.Name)
		}
		now := time.Now()
		value, err := secrets.Rotate(s.ctx, s.cfg.Client, s.cfg.SecretsNamespace, app, ref, now)
		if err != nil {
			return err
		}
		if app.Spec.Git.WebhookSecretRef == nil {
			if _, err := s.updateApp(app.Name, func(a *appv1.App) error {
				if a.Spec.Git.WebhookSecretRef == nil {
					a.Spec.Git.WebhookSecretRef = ref
				}
				return nil
			}); err != nil {
				return err
			}
		}
		st, err := s.secretStore().Get(s.ctx, ref)
		if err != nil {
			return err
		}
		s.audit("webhooks:secret", app.Name, "rotated", !st.PreviousUntil.IsZero())
		out := WebhookSecret{App: app.Name, URL: s.hookURL(app.Name), Secret: value}
		if !st.PreviousUntil.IsZero() {
			t := st.PreviousUntil.UTC()
			out.PreviousValidUntil = &t
		}
		if secretJSON {
			return s.json(out)
		}
		// The secret alone on stdout, for scripts; what to do with it on stderr.
		fmt.Fprintln(s.out, value)
		fmt.Fprintf(s.errOut, "The webhook secret of %s: shown this once. Set it in the git host's webhook settings", app.Name)
		if out.URL != "" {
			fmt.Fprintf(s.errOut, " with the URL %s", out.URL)
		}
		fmt.Fprintln(s.errOut, ".")
		if out.PreviousValidUntil != nil {
			fmt.Fprintf(s.errOut, "The previous secret verifies too until %s, or until webhooks:secret %s --drop-previous.\n", out.PreviousValidUntil.Format(time.RFC3339), app.Name)
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
			if !validUpstream(url) {
				return fail("upstream %q: want https://HOST/PATH, ssh://HOST/PATH, git@HOST:PATH or file:///PATH", url)
			}
		}
		app, err := s.updateApp(a[0], func(app *appv1.App) error {
			if app.Spec.Git.Upstream == url {
				return appops.ErrNoChange
			}
			app.Spec.Git.Upstream = url
			return nil
		})
		if errors.Is(err, appops.ErrNoChange) {
			err = nil
		}
		if err != nil {
			return err
		}
		s.audit("webhooks:upstream", a[0], "upstream", url)
		if url == "" {
			fmt.Fprintf(s.out, "%s has no upstream: a webhook delivery rebuilds its current commit.\n", a[0])
			return nil
		}
		fmt.Fprintf(s.out, "A webhook delivery for %s fetches %s, builds the deploy branch's commit and moves it once it serves.\n", a[0], url)
		if app != nil && app.Spec.Git.WebhookSecretRef == nil {
			fmt.Fprintf(s.errOut, "%s has no webhook secret yet: webhooks:secret %s makes one.\n", a[0], a[0])
		}
		return nil
	})
	flags(upstream).BoolVar(&unset, "unset", false, "remove the upstream: deliveries rebuild the current commit")
	return []*cobra.Command{info, secret, upstream}
}

func deployBranch(a *appv1.App) string {
	if a.Spec.Git.DeployBranch == "" {
		return appv1.DefaultDeployBranch
	}
	return a.Spec.Git.DeployBranch
}

// validUpstream is the API's rule for spec.git.upstream (a URL of a scheme the
// gitserver fetches, no spaces), checked here to refuse in one clear line.
func validUpstream(url string) bool {
	if url == "" || len(url) > 2048 || strings.ContainsAny(url, " \t\n") {
		return false
	}
	for _, p := range []string{"https://", "ssh://", "git@", "file:///"} {
		if strings.HasPrefix(url, p) && len(url) > len(p) {
			return true
		}
	}
	return false
}
