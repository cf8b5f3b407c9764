package gitserver

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gliderlabs/ssh"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
)

// uploadPack serves git clone and git fetch with the git binary's upload-pack: it
// speaks every protocol version and negotiation the client may use, and nothing
// bex does happens on a fetch.
func (s *Server) uploadPack(ctx context.Context, sess ssh.Session, user *backend.User, appName string, log *slog.Logger) {
	app, err := s.dir.App(ctx, appName)
	if errors.Is(err, pipeline.ErrAppNotFound) {
		fatal(sess, "app "+appName+" does not exist")
		return
	}
	if err != nil {
		log.Error("app lookup failed", "err", err)
		fatal(sess, "internal error: try again")
		return
	}
	if !user.MayUseApp(appName, app.Members) {
		fatal(sess, "user "+user.Name+" has no access to app "+appName+": ask an admin to add you to its members")
		return
	}
	backend.Used(ctx, appName)
	repoDir := s.pipeline.RepositoryDir(appName)
	if _, err := os.Stat(filepath.Join(repoDir, "HEAD")); err != nil {
		fatal(sess, "app "+appName+" has no code yet: push first")
		return
	}
	// refs/bex/ holds what Deploy fetched from an upstream before it serves: not
	// for clones.
	cmd := exec.CommandContext(ctx, "git", "-c", "uploadpack.hideRefs=refs/bex/", "upload-pack", "--strict", "--timeout=600", repoDir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = sess, sess, sess.Stderr()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + repoDir, "GIT_CONFIG_NOSYSTEM=1"}
	for _, kv := range sess.Environ() {
		// Protocol v2 is asked for through this variable (ssh SendEnv).
		if strings.HasPrefix(kv, "GIT_PROTOCOL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	code := 0
	if err := cmd.Run(); err != nil {
		code = 1
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		}
		log.Info("upload-pack ended", "err", err)
	}
	_ = sess.Exit(code)
}
