package sshcmd

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/backend"
)

func (s *session) tokenCommands() []*cobra.Command {
	var createJSON, readOnly bool
	var expiresIn, apps string
	create := newCmd(groupAccess, "tokens:create NAME", "Make a bearer token for the agents' API (MCP), acting as you (--apps, --read-only: less); printed once", args(1, 1), func(cmd *cobra.Command, a []string) error {
		scope := backend.TokenScope{ReadOnly: readOnly}
		if cmd.Flags().Changed("apps") {
			// Every name as given, empty ones too: the backend refuses those
			// rather than the token being made for fewer apps than asked.
			scope.Apps = strings.Split(apps, ",")
		}
		out, err := s.b.CreateToken(s.ctx, s.user, a[0], expiresIn, scope)
		if err != nil {
			return err
		}
		if createJSON {
			return s.json(out)
		}
		until := fmt.Sprintf("until tokens:revoke %s", a[0])
		if out.Expires != nil {
			until = fmt.Sprintf("until %s (tokens:revoke %s ends it sooner)", out.Expires.Format(time.RFC3339), a[0])
		}
		does := fmt.Sprintf("does what %s may do", out.User)
		switch sc := out.Scope; {
		case len(sc.Apps) > 0 && sc.ReadOnly:
			does = fmt.Sprintf("reads what %s may read of the apps %s, and changes nothing", out.User, strings.Join(sc.Apps, ", "))
		case len(sc.Apps) > 0:
			does = fmt.Sprintf("does what %s may do with the apps %s, and nothing else", out.User, strings.Join(sc.Apps, ", "))
		case sc.ReadOnly:
			does = fmt.Sprintf("reads what %s may read, and changes nothing", out.User)
		}
		fmt.Fprintln(s.out, out.Token)
		fmt.Fprintf(s.errOut, "Token %s of %s: shown this once. It %s, %s.\n", a[0], out.User, does, until)
		if out.MCP != "" {
			fmt.Fprintf(s.errOut, "MCP endpoint (streamable HTTP): %s with the header Authorization: Bearer <token>\n", out.MCP)
		}
		return nil
	})
	jsonFlag(create, &createJSON)
	create.Flags().StringVar(&expiresIn, "expires-in", backend.DefaultTokenTTL, "how long the token works: 90d, 12h, 30m, or never")
	create.Flags().StringVar(&apps, "apps", "", "the only apps the token may use, comma-separated (apps you may use): it sees no other, and has none of your powers beyond them")
	create.Flags().BoolVar(&readOnly, "read-only", false, "the token may read and change nothing (the MCP server lists it only reading tools)")

	var listJSON bool
	list := newCmd(groupAccess, "tokens:list", "List your agents' API tokens (names, not values)", args(0, 0), func(*cobra.Command, []string) error {
		out, err := s.b.Tokens(s.ctx, s.user)
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
		fmt.Fprintln(w, "NAME\tCREATED\tEXPIRES\tSCOPE\tFINGERPRINT")
		for _, t := range out {
			expires := "never"
			if t.Expires != nil {
				expires = t.Expires.Format(time.RFC3339)
				if !t.Expires.After(time.Now()) {
					expires += " (expired)"
				}
			}
			if t.Refused != "" {
				expires = "refused"
			}
			fp := t.Fingerprint
			if fp == "" {
				fp = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.Name, t.Created.Format(time.RFC3339), expires, t.Scope, fp)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		// Why a token is refused takes a sentence, too long for a column.
		for _, t := range out {
			if t.Refused != "" {
				fmt.Fprintf(s.out, "Token %s is refused: %s (tokens:revoke %s removes it).\n", t.Name, t.Refused, t.Name)
			}
		}
		return nil
	})
	jsonFlag(list, &listJSON)
	list.Aliases = []string{"tokens"}

	revoke := newCmd(groupAccess, "tokens:revoke NAME", "Revoke one of your tokens; calls with it fail from then on", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.b.RevokeToken(s.ctx, s.user, a[0]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Revoked token %s of %s.\n", a[0], s.user.Name)
		return nil
	})
	return []*cobra.Command{create, list, revoke}
}
