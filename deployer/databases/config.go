package databases

import (
	"errors"
	"fmt"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Image is the server image of an engine and the version it runs.
type Image struct {
	// Ref is the image: "postgres:15", or the Debian stand-in of a machine
	// without a registry (bex up --local-bases).
	Ref string
	// Version is the engine's major version the image runs.
	Version string
}

// Config is the reconciler's configuration; cmd/bex fills it from
// DefaultConfig.
type Config struct {
	// Postgres and Redis are the images of the engines. An image must behave
	// as the official one does: its docker-entrypoint.sh initialises the data
	// directory from POSTGRES_PASSWORD, POSTGRES_USER and POSTGRES_DB (Postgres)
	// and drops root before it runs the server.
	Postgres, Redis Image
	// PortMin and PortMax bound the ports databases get on the apps' gateway.
	// They must not be ports of the host that tenants reach (the edge's).
	PortMin, PortMax int
	// MaxInstances is how many servers a database may ask for: 1 on one machine.
	MaxInstances int32
	// RequeueStarting is how soon a database that is not yet ready is looked at
	// again; RequeueRunning how often a running one is (its used bytes, a crash).
	RequeueStarting, RequeueRunning time.Duration
	// RetryFailed is how long a failed server waits before it is tried again
	// (Reconciler.retry).
	RetryFailed time.Duration
}

// DefaultConfig returns the defaults: the official images.
func DefaultConfig() Config {
	return Config{
		Postgres:        Image{Ref: "docker.io/library/postgres:15", Version: "15"},
		Redis:           Image{Ref: "docker.io/library/redis:7", Version: "7"},
		PortMin:         25000,
		PortMax:         25999,
		MaxInstances:    1,
		RequeueStarting: time.Second,
		RequeueRunning:  30 * time.Second,
		RetryFailed:     10 * time.Second,
	}
}

// Validate reports what is missing or out of range.
func (c Config) Validate() error {
	var errs []error
	if c.Postgres.Ref == "" || c.Redis.Ref == "" {
		errs = append(errs, errors.New("databases: both images must be set"))
	}
	if c.PortMin < 1024 || c.PortMax > 65535 || c.PortMin > c.PortMax {
		errs = append(errs, fmt.Errorf("databases: ports %d-%d: want 1024 <= min <= max <= 65535", c.PortMin, c.PortMax))
	}
	if c.MaxInstances < 1 {
		errs = append(errs, errors.New("databases: MaxInstances must be at least 1"))
	}
	if c.RequeueStarting <= 0 || c.RequeueRunning <= 0 || c.RetryFailed <= 0 {
		errs = append(errs, errors.New("databases: requeue intervals must be positive"))
	}
	return errors.Join(errs...)
}

// image is the image of engine e.
func (c Config) image(e appv1.DatabaseEngine) Image {
	if e == appv1.EngineRedis {
		return c.Redis
	}
	return c.Postgres
}
