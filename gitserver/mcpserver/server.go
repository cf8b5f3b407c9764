package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/clientaddr"
	"bex.co/bex/internal/sourcelimit"
)

// Config is what the server works with. cmd/bex fills it.
type Config struct {
	// Backend does what the tools ask and verifies the bearer tokens.
	Backend *backend.Backend
	// MaxLogBytes bounds what logs and build_logs return (their tail).
	MaxLogBytes int
	// Version is bex's, shown to clients.
	Version string
	// Log receives refused tokens and the SDK's messages; nil: slog.Default().
	Log *slog.Logger
	// FailedTokens limits the bearer tokens that do not verify, per source
	// (the request's client, clientaddr): past it, every request from that
	// source is answered 429 with Retry-After, without a read of the API.
	FailedTokens sourcelimit.Config
	// TrustedProxies are the peers (bex's edge) whose X-Forwarded-For names the
	// client a request is counted under; the webhooks' setting, as both share
	// the gitserver's HTTP listener.
	TrustedProxies clientaddr.Trusted
	// ProxySecret is the webhooks' too: any peer that sends it in
	// clientaddr.HeaderProxySecret (bex's edge on a cluster) is a trusted proxy.
	ProxySecret []byte
	// Recheck is how often a tool call still running checks its user again
	// (the User, its role and its access to the apps the call works on), so
	// that a call of a user whose access was taken away ends within about it.
	Recheck time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{MaxLogBytes: 64 << 10, Version: "dev", FailedTokens: sourcelimit.DefaultConfig(), Recheck: time.Second}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Backend == nil {
		errs = append(errs, errors.New("mcpserver: Config.Backend is required"))
	}
	if c.MaxLogBytes < 1024 {
		errs = append(errs, fmt.Errorf("mcpserver: Config.MaxLogBytes %d must be at least 1024", c.MaxLogBytes))
	}
	if c.Version == "" {
		errs = append(errs, errors.New("mcpserver: Config.Version is required (DefaultConfig has one)"))
	}
	if err := c.FailedTokens.Validate("mcpserver: Config.FailedTokens"); err != nil {
		errs = append(errs, err)
	}
	if c.Recheck <= 0 {
		errs = append(errs, fmt.Errorf("mcpserver: Config.Recheck %s must be positive", c.Recheck))
	}
	if c.ProxySecret != nil {
		if err := clientaddr.CheckSecret(c.ProxySecret); err != nil {
			errs = append(errs, fmt.Errorf("mcpserver: Config.ProxySecret: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Server is the MCP server.
type Server struct {
	cfg    Config
	mcp    *mcp.Server
	log    *slog.Logger
	failed *sourcelimit.Limiter
}

// New returns the server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	failed, err := sourcelimit.New(cfg.FailedTokens)
	if err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, log: log.WithGroup("mcpserver"), failed: failed}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "bex", Title: "bex: git-push PaaS", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: "bex runs apps from git. Tools act as the user whose token you hold, on the apps that user may use " +
			"(a token may be limited to some apps, or to reading: tools/list then shows the tools it may call). " +
			"Each result says what happened in text and in structured fields; a refusal is a tool error whose text is " +
			"\"CODE: MESSAGE\", CODE one of not_found, forbidden, invalid, conflict, failed or internal.",
		Logger: s.log,
	})
	s.tools()
	s.mcp.AddReceivingMiddleware(s.scopeToolList)
	return s, nil
}

// attemptKey carries a request's sourcelimit.Attempt to the token verifier.
type attemptKey struct{}

// Handler serves MCP over streamable HTTP, for requests with a valid bearer
// token. Failed tokens are limited per source address: a source past the limit
// gets 429 with Retry-After for every request, before any verification (so
// without a read of the API). The source is the request's client: the peer, or
// behind a trusted proxy (the edge: Config.TrustedProxies by its address, or
// Config.ProxySecret) the client it names.
func (s *Server) Handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Logger: s.log,
	})
	verify := func(ctx context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
		attempt, _ := ctx.Value(attemptKey{}).(*sourcelimit.Attempt)
		// The backend's store checks the token's shape before any read: a
		// malformed one costs the API server nothing.
		u, name, err := s.cfg.Backend.VerifyToken(ctx, token)
		if err != nil {
			if errors.Is(err, backend.ErrInvalidToken) {
				if attempt != nil {
					attempt.Failed()
				}
				s.log.Warn("token refused", "remote", r.RemoteAddr, "reason", err.Error())
				return nil, auth.ErrInvalidToken
			}
			return nil, err
		}
		// Given back now, not when the request ends: a stream that stays open
		// must not hold its source's allowance.
		if attempt != nil {
			attempt.Succeeded()
		}
		// UserID ties the MCP session to the user: the SDK refuses a session id
		// presented with another user's token.
		return &auth.TokenInfo{UserID: u.Name, Expiration: time.Now().Add(time.Hour),
			Extra: map[string]any{"user": u, "token": name}}, nil
	}
	authed := auth.RequireBearerToken(verify, nil)(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempt, wait := s.failed.Begin(sourcelimit.Source(s.cfg.TrustedProxies.OfProxiedRequest(r, s.cfg.ProxySecret)))
		if attempt == nil {
			secs := sourcelimit.RetryAfter(wait)
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			http.Error(w, fmt.Sprintf("too many refused tokens from your address: retry in %d s", secs), http.StatusTooManyRequests)
			return
		}
		// Whatever did not fail a token (no token at all, an API error) is
		// given back; Failed, called first, keeps it.
		defer attempt.Succeeded()
		authed.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), attemptKey{}, attempt)))
	})
}

// userOf is the user a request acts as, with its token's scope, put there by
// Handler's verifier.
func userOf(extra *mcp.RequestExtra) (*backend.User, error) {
	if extra != nil && extra.TokenInfo != nil {
		if u, ok := extra.TokenInfo.Extra["user"].(*backend.User); ok {
			return u, nil
		}
	}
	return nil, backend.Errorf(backend.Forbidden, "no user: call with a bearer token (ssh bex@HOST tokens:create NAME)")
}

// scopeToolList answers tools/list for the token of the request: a read-only
// token (or none) is shown the reading tools only, those registered with
// reads (their annotation readOnlyHint). The list then depends on the token,
// so its cache scope is private. Hiding a tool is for the agent's sake: the
// backend refuses a read-only token every change, whatever tool it calls.
func (s *Server) scopeToolList(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		list, ok := res.(*mcp.ListToolsResult)
		if err != nil || !ok {
			return res, err
		}
		list.CacheScope = "private"
		if u, err := userOf(req.GetExtra()); err != nil || u.Scope.ReadOnly {
			list.Tools = slices.DeleteFunc(slices.Clone(list.Tools), func(t *mcp.Tool) bool {
				return t.Annotations == nil || !t.Annotations.ReadOnlyHint
			})
		}
		return list, nil
	}
}

// handler is a tool's code: it gets the caller and the arguments and returns the
// structured result and the sentence that says it.
type handler[In, Out any] func(ctx context.Context, u *backend.User, in In) (Out, string, error)

// effect is what a tool does, said once, where it is registered: reads
// changes nothing, changes changes something (an app, a database, a volume,
// a release). Its annotation readOnlyHint says it to clients, and tools/list
// shows a read-only token the reading tools only (scopeToolList).
type effect bool

// The effects.
const (
	reads   effect = true
	changes effect = false
)

// addTool registers the tool name, which does what eff says.
func addTool[In, Out any](s *Server, name string, eff effect, desc string, h handler[In, Out]) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: input schema of %s: %v", name, err))
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: output schema of %s: %v", name, err))
	}
	if eff == changes {
		checkChanging[In, Out](name)
	}
	tool := &mcp.Tool{Name: name, Description: desc, InputSchema: in, OutputSchema: out, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: bool(eff)}}
	s.mcp.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u, err := userOf(req.Extra)
		if err != nil {
			return s.toolError(name, nil, err), nil
		}
		var args In
		if raw := req.Params.Arguments; len(raw) > 0 && string(raw) != "null" {
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&args); err != nil {
				return s.toolError(name, u, backend.Errorf(backend.Invalid, "arguments of %s: %v", name, err)), nil
			}
		}
		var c Change
		if eff == changes {
			c = any(args).(changer).change()
			if u, err = withCall(u, req.Session, c); err != nil {
				return s.toolError(name, nil, err), nil
			}
		}
		wctx, uses, stop := s.watch(ctx, u)
		var res Out
		var text string
		if c.DryRun {
			res, text, err = dryRun(wctx, u, name, args, h)
		} else {
			res, text, err = h(wctx, u, args)
		}
		if why := stop(); why != nil {
			return s.toolError(name, u, why), nil
		}
		var verdict *verdictError
		switch {
		case errors.As(err, &verdict):
			// A change that makes a release: its verdict, shown already.
			return s.toolError(name, u, err), nil
		case err != nil:
			// A failure may quote what the app printed last: a verdict.
			return s.toolError(name, u, s.outputInError(ctx, u, uses.Apps(), err)), nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: res}, nil
	})
}

// toolError is the one mapping of an error to a tool's result: a tool error
// (isError) whose only content is the text "CODE: MESSAGE", CODE the error's
// kind (not_found, forbidden, invalid, conflict, failed, or internal, logged
// with its cause, for one without a kind). It carries no structured content:
// that would have to match the tool's output schema, which describes the
// tool's result, and clients that check it (the official TypeScript SDK) would
// throw instead of handing the agent the error.
func (s *Server) toolError(tool string, u *backend.User, err error) *mcp.CallToolResult {
	kind := backend.KindOf(err)
	if kind == backend.Internal {
		user := ""
		if u != nil {
			user = u.Name
		}
		s.log.Error("tool failed", "tool", tool, "user", user, "err", err)
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: kind.String() + ": " + err.Error()}}}
}

// watch checks u again every Config.Recheck while a tool call runs, against the
// User as the cache has it now and the apps the call has read (backend.Recheck,
// the same rule every call starts with). The context it returns ends when u may
// no longer go on: removed, demoted, or taken off an app the call works on (a
// deploy waiting for the app's lock, a slow log read); uses are the apps the
// call read. stop ends the watch and returns the Forbidden error that says why
// the call was ended, or nil.
func (s *Server) watch(ctx context.Context, u *backend.User) (context.Context, *backend.Uses, func() error) {
	uses := &backend.Uses{}
	ctx, end := context.WithCancelCause(backend.WithUses(ctx, uses))
	done := make(chan struct{})
	var why error // written before end, read after done: no race
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(s.cfg.Recheck)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := s.cfg.Backend.Recheck(ctx, u, uses.Apps())
			switch {
			case err == nil:
			case backend.KindOf(err) == backend.Forbidden:
				s.log.Info("ending tool call: access withdrawn", "user", u.Name, "token", u.KeyName, "reason", err.Error())
				why = err
				end(err)
				return
			case ctx.Err() == nil:
				// The cache cannot answer: keep the call rather than end it on a
				// transient failure.
				s.log.Warn("tool call recheck failed", "user", u.Name, "err", err)
			}
		}
	}()
	return ctx, uses, func() error {
		close(done)
		<-finished
		end(nil)
		return why
	}
}
