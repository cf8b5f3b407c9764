package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"bex.co/bex/internal/clusterapi"
	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/pki"
)

// serve runs the management plane of DIR until SIGTERM or SIGINT: the control
// plane, the CRDs and webhook configurations, the four managers; then DIR/mgmt/ready.
func serve(l layout) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := os.MkdirAll(l.logs(), 0o700); err != nil {
		return err
	}
	// One serve per DIR: the lock is held while this process lives.
	lockFile, err := os.OpenFile(l.path("serve.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lockFile.Close()
	if err := syscall.Flock(int(lockFile.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("the management plane of %s runs already (PID file %s): capdmgmt down %s first", l.dir, l.pidFile(), l.dir)
	}
	_ = os.Remove(l.readyFile())
	if err := pki.WriteFile(l.pidFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer l.removePIDFile(os.Getpid())
	defer os.Remove(l.readyFile())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s := &server{l: l, log: log}
	err = s.start(ctx)
	if err == nil {
		<-ctx.Done()
		// Not ready from the moment it stops.
		_ = os.Remove(l.readyFile())
		log.Info("stopping", "cause", context.Cause(ctx))
	}
	// What started is stopped, the managers before the API server they use.
	if s.sup != nil {
		if serr := s.sup.Stop(); serr != nil {
			log.Warn("stop the managers", "err", serr)
		}
	}
	if s.cp != nil {
		if serr := s.cp.stop(); serr != nil {
			log.Warn("stop etcd and kube-apiserver", "err", serr)
		}
	}
	if err != nil && ctx.Err() != nil {
		// Stopped while starting: what was asked.
		log.Info("stopped while starting", "err", err)
		return nil
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}

// server is what serve started.
type server struct {
	l   layout
	log *slog.Logger
	cp  *controlPlane
	sup *supervise.Supervisor
}

func (s *server) start(ctx context.Context) error {
	began := time.Now()
	lap := func(what string) { s.log.Info(what, "seconds", fmt.Sprintf("%.1f", time.Since(began).Seconds())) }
	root, err := checkout()
	if err != nil {
		return err
	}
	bins, err := preflight(root)
	if err != nil {
		return err
	}
	version, err := clusterapi.ReleaseVersion(filepath.Join(root, "hack/versions.env"))
	if err != nil {
		return fmt.Errorf("which Cluster API release: %w (run capdmgmt from a full bex checkout)", err)
	}
	release, err := clusterapi.DownloadRelease(version)
	if err != nil {
		return fmt.Errorf("%w: the Cluster API %s sources are needed (is the module proxy reachable?)", err, version)
	}
	managers, err := clusterapi.WithFreePorts(clusterapi.Managers())
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	if s.cp, err = startControlPlane(s.l.mgmt(), bins, s.l.kubeconfig()); err != nil {
		return err
	}
	lap("etcd and kube-apiserver ready")
	if err := ctx.Err(); err != nil {
		return err
	}

	// A new certificate at each start: nothing but these managers trusts it, and
	// the CRDs and webhook configurations are written with it again below.
	caPEM, certDir, err := clusterapi.WebhookServingCert(s.l.mgmt(), "capdmgmt webhook CA", 365*24*time.Hour)
	if err != nil {
		return err
	}
	n, err := install(ctx, s.cp.config, release, bins["kubectl"], managers, caPEM)
	if err != nil {
		return err
	}
	lap(fmt.Sprintf("%d CRDs and the webhook configurations installed", n))

	s.sup = supervise.New(s.log)
	if err := s.startManagers(ctx, managers, bins, certDir, version); err != nil {
		return err
	}
	lap("the four managers ready")
	if err := pki.WriteFile(s.l.readyFile(), []byte(time.Now().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return err
	}
	s.log.Info("ready", "kubeconfig", s.l.kubeconfig())
	return nil
}

// startManagers starts the managers at once (each waits for nothing of the
// others) under the supervisor and waits until each is ready and of the release.
func (s *server) startManagers(ctx context.Context, managers []clusterapi.Manager, bins map[string]string, certDir, release string) error {
	errs := make([]error, len(managers))
	var wg sync.WaitGroup
	for i, m := range managers {
		logPath := s.l.logFile(m.Name)
		// The log of the last run is kept aside: CheckVersion reads this run's.
		_ = os.Rename(logPath, logPath+".prev")
		wg.Go(func() {
			_, err := s.sup.Start(ctx, supervise.Process{
				Name:    m.Name,
				Path:    bins[m.Name],
				Args:    m.Args(s.l.kubeconfig(), certDir),
				LogPath: logPath,
				Ready:   m.Ready,
				// Their caches sync against a fresh API server; on a loaded
				// machine that has taken most of a minute.
				ReadyTimeout: 2 * time.Minute,
			})
			if err == nil {
				err = clusterapi.CheckVersion(m, logPath, release)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
