package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"bex.co/bex/gitserver"
	"bex.co/bex/internal/appops"
)

// Verifier turns a bearer token into the user it acts as.
type Verifier interface {
	// Verify returns the token's user and the token's name, or an error wrapping
	// tokens.ErrInvalid.
	Verify(ctx context.Context, token string) (*gitserver.User, string, error)
}

// Deployer rebuilds and rolls out apps.
type Deployer interface {
	// Deploy builds app's deploy branch (fetched from its upstream when it has
	// one), or commit when not empty, records a release by actor (cause Deploy)
	// and waits for it to serve. Errors: gitserver.ErrNothingToDeploy, ErrBusy,
	// ErrDeployFailed, ErrAppNotFound.
	Deploy(ctx context.Context, app, commit, actor string) (*gitserver.DeployResult, error)
}

// Logs reads an app's runtime logs.
type Logs interface {
	// Tail writes the last lines of each instance of app (of process, when not
	// empty) to w, each prefixed with its instance.
	Tail(ctx context.Context, app, process string, lines int, w io.Writer) error
}

// Builds reads an app's stored build logs.
type Builds interface {
	// List returns app's builds, newest first.
	List(app string) ([]Build, error)
	// Open opens one build's log; an error wrapping fs.ErrNotExist when there is
	// no such build.
	Open(app, id string) (io.ReadCloser, error)
}

// Build is one stored build.
type Build struct {
	ID     string    `json:"id"`
	Commit string    `json:"commit"`
	Time   time.Time `json:"time"`
}

// Config is what the server works with.
type Config struct {
	Ops      *appops.Ops
	Tokens   Verifier
	Deployer Deployer // nil: deploy says it is not available
	Logs     Logs     // nil: logs says it is not available
	Builds   Builds   // nil: build_logs says it is not available
	// RolloutTimeout bounds the wait of rollback and set_config for their release.
	RolloutTimeout time.Duration
	// MaxLogBytes bounds what logs and build_logs return (their tail).
	MaxLogBytes int
	Version     string
	Log         *slog.Logger
}

// Server is the MCP server.
type Server struct {
	cfg Config
	mcp *mcp.Server
	log *slog.Logger
}

// New returns the server.
func New(cfg Config) (*Server, error) {
	if cfg.Ops == nil || cfg.Tokens == nil {
		return nil, errors.New("agentapi: Ops and Tokens are required")
	}
	if cfg.RolloutTimeout <= 0 {
		cfg.RolloutTimeout = 5 * time.Minute
	}
	if cfg.MaxLogBytes <= 0 {
		cfg.MaxLogBytes = 64 << 10
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	s := &Server{cfg: cfg, log: cfg.Log.WithGroup("agentapi")}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "bex", Title: "bex: git-push PaaS", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: "bex runs apps from git. Tools act as the user whose token you hold, on the apps that user may use. " +
			"Each result says what happened in text and in structured fields; a refusal is a tool error whose text is " +
			"\"CODE: MESSAGE\", CODE one of not_found, forbidden, invalid, conflict, failed or internal.",
		Logger: s.log,
	})
	s.tools()
	return s, nil
}

// Handler serves MCP over streamable HTTP, for requests with a valid bearer token.
func (s *Server) Handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Logger: s.log,
	})
	verify := func(ctx context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
		u, name, err := s.cfg.Tokens.Verify(ctx, token)
		if err != nil {
			if strings.Contains(err.Error(), "invalid token") {
				s.log.Warn("token refused", "remote", r.RemoteAddr, "reason", err.Error())
				return nil, auth.ErrInvalidToken
			}
			return nil, err
		}
		// UserID ties the MCP session to the user: the SDK refuses a session id
		// presented with another user's token.
		return &auth.TokenInfo{UserID: u.Name, Expiration: time.Now().Add(time.Hour),
			Extra: map[string]any{"user": u, "token": name}}, nil
	}
	return auth.RequireBearerToken(verify, nil)(h)
}

// userOf is the user a call acts as, put there by Handler's verifier.
func userOf(req *mcp.CallToolRequest) (*gitserver.User, error) {
	if req.Extra != nil && req.Extra.TokenInfo != nil {
		if u, ok := req.Extra.TokenInfo.Extra["user"].(*gitserver.User); ok {
			return u, nil
		}
	}
	return nil, appops.Fail(appops.Forbidden, "no user: call with a bearer token (ssh bex@HOST tokens:create NAME)")
}

// handler is a tool's code: it gets the caller and the arguments and returns the
// structured result and the sentence that says it.
type handler[In, Out any] func(ctx context.Context, u *gitserver.User, in In) (Out, string, error)

func addTool[In, Out any](s *Server, name, desc string, h handler[In, Out]) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("agentapi: input schema of %s: %v", name, err))
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("agentapi: output schema of %s: %v", name, err))
	}
	s.mcp.AddTool(&mcp.Tool{Name: name, Description: desc, InputSchema: in, OutputSchema: out}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u, err := userOf(req)
		if err != nil {
			return s.toolError(name, nil, err), nil
		}
		var args In
		if raw := req.Params.Arguments; len(raw) > 0 && string(raw) != "null" {
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&args); err != nil {
				return s.toolError(name, u, appops.Fail(appops.Invalid, "arguments of %s: %v", name, err)), nil
			}
		}
		res, text, err := h(ctx, u, args)
		if err != nil {
			return s.toolError(name, u, err), nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: res}, nil
	})
}

// toolError is the one mapping of an error to a tool's result: a tool error
// (isError) whose only content is the text "CODE: MESSAGE", CODE one of not_found,
// forbidden, invalid, conflict, failed or internal (the error's kind; internal,
// logged with its cause, for one without a kind). It carries no structured
// content: that would have to match the tool's output schema, which describes the
// tool's result, and clients that check it (the official TypeScript SDK) would
// throw instead of handing the agent the error.
func (s *Server) toolError(tool string, u *gitserver.User, err error) *mcp.CallToolResult {
	code := appops.KindOf(err)
	if code == "" {
		code = "internal"
		user := ""
		if u != nil {
			user = u.Name
		}
		s.log.Error("tool failed", "tool", tool, "user", user, "err", err)
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: string(code) + ": " + err.Error()}}}
}
