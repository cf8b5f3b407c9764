package sshcmd

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/tokens"
)

// TokenInfo is one token in `tokens:list --json`.
type TokenInfo = tokens.Token

// TokenCreated is `tokens:create NAME --json`.
type TokenCreated struct {
	Name  string `json:"name"`
	User  string `json:"user"`
	Token string `json:"token"`
	// MCP is the agents' endpoint the token opens; empty when this server serves
	// none.
	MCP string `json:"mcp"`
	// Expires is when the token stops working; absent: never.
	Expires *time.Time `json:"expires,omitempty"`
}

// DefaultTokenTTL is how long a token works unless tokens:create says otherwise:
// an agent's access should end on its own.
const DefaultTokenTTL = "90d"

func (s *session) mcpURL() string {
	if s.cfg.HooksURL == "" {
		return ""
	}
	return strings.TrimSuffix(s.cfg.HooksURL, "/") + "/mcp"
}

func (s *session) tokenErr(err error) error {
	for _, e := range []error{tokens.ErrExists, tokens.ErrNotFound, tokens.ErrInvalidName, tokens.ErrTooMany} {
		if errors.Is(err, e) {
			return fail("%s", strings.TrimPrefix(err.Error(), e.Error()+": "))
		}
	}
	return err
}

func (s *session) tokenCommands() []*cobra.Command {
	var createJSON bool
	var expiresIn string
	create := newCmd(groupAccess, "tokens:create NAME", "Make a bearer token for the agents' API (MCP), acting as you; printed once", args(1, 1), func(_ *cobra.Command, a []string) error {
		if s.cfg.Tokens == nil {
			return fail("this server has no agents' API")
		}
		ttl, err := tokens.ParseTTL(expiresIn)
		if err != nil {
			return fail("--expires-in %v", err)
		}
		tok, err := s.cfg.Tokens.Create(s.ctx, s.user.Name, a[0], ttl)
		if err != nil {
			return s.tokenErr(err)
		}
		s.audit("tokens:create", "", "token", a[0], "expires_in", expiresIn)
		out := TokenCreated{Name: a[0], User: s.user.Name, Token: tok, MCP: s.mcpURL()}
		until := fmt.Sprintf("until tokens:revoke %s", a[0])
		if ttl > 0 {
			exp := time.Now().Add(ttl).UTC().Truncate(time.Second)
			out.Expires = &exp
			until = fmt.Sprintf("until %s (tokens:revoke %s ends it sooner)", exp.Format(time.RFC3339), a[0])
		}
		if createJSON {
			return s.json(out)
		}
		// The token alone on stdout, for scripts; the rest on stderr.
		fmt.Fprintln(s.out, tok)
		fmt.Fprintf(s.errOut, "Token %s of %s: shown this once. It does what %s may do, %s.\n", a[0], s.user.Name, s.user.Name, until)
		if out.MCP != "" {
			fmt.Fprintf(s.errOut, "MCP endpoint (streamable HTTP): %s with the header Authorization: Bearer <token>\n", out.MCP)
		}
		return nil
	})
	jsonFlag(create, &createJSON)
	create.Flags().StringVar(&expiresIn, "expires-in", DefaultTokenTTL, "how long the token works: 90d, 12h, 30m, or never")

	var listJSON bool
	list := newCmd(groupAccess, "tokens:list", "List your agents' API tokens (names, not values)", args(0, 0), func(*cobra.Command, []string) error {
		if s.cfg.Tokens == nil {
			return fail("this server has no agents' API")
		}
		out, err := s.cfg.Tokens.List(s.ctx, s.user.Name)
		if err != nil {
			return err
		}
		if listJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintln(s.out, "No tokens: tokens:create NAME makes one.")
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "NAME\tCREATED\tEXPIRES")
		for _, t := range out {
			expires := "never"
			if t.Expires != nil {
				expires = t.Expires.Format(time.RFC3339)
				if !t.Expires.After(time.Now()) {
					expires += " (expired)"
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\n", t.Name, t.Created.Format(time.RFC3339), expires)
		}
		return w.Flush()
	})
	jsonFlag(list, &listJSON)
	list.Aliases = []string{"tokens"}

	revoke := newCmd(groupAccess, "tokens:revoke NAME", "Revoke one of your tokens; calls with it fail from then on", args(1, 1), func(_ *cobra.Command, a []string) error {
		if s.cfg.Tokens == nil {
			return fail("this server has no agents' API")
		}
		if err := s.cfg.Tokens.Revoke(s.ctx, s.user.Name, a[0]); err != nil {
			return s.tokenErr(err)
		}
		s.audit("tokens:revoke", "", "token", a[0])
		fmt.Fprintf(s.out, "Revoked token %s of %s.\n", a[0], s.user.Name)
		return nil
	})
	return []*cobra.Command{create, list, revoke}
}
