package cluster

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"

	"bex.co/bex/deployer/databases"
	"bex.co/bex/deployer/runtime/kube"
)

// Ports the servers listen on, in the credentials' URL.
const (
	PostgresPort = 5432
	RedisPort    = 6379
)

// DefaultOperatorNamespace is where CloudNativePG's operator runs (its
// manifests' namespace).
const DefaultOperatorNamespace = "cnpg-system"

// DefaultPostgresUID is the uid and gid of the postgres user in
// CloudNativePG's own images (26, Red Hat's), its default.
const DefaultPostgresUID = 26

// Config is the reconciler's configuration; cmd/bex fills it from
// DefaultConfig.
type Config struct {
	// Postgres is CloudNativePG's operand image (the Cluster's imageName): a
	// PostgreSQL whose major version its tag says (CloudNativePG reads it
	// there), with psql and pg_dump, which the databases' one-offs run.
	Postgres databases.Image
	// PostgresUID and PostgresGID are the postgres user's ids in that image.
	PostgresUID, PostgresGID int64
	// Redis is the Redis image, with the contract of the local runtime's
	// (databases.RedisServer: docker-entrypoint.sh drops root).
	Redis databases.Image
	// StorageClass is the class of the databases' PersistentVolumeClaims;
	// empty is the cluster's default class.
	StorageClass string
	// Pods confines the Redis pods as the apps' are (HostUsers, the pull
	// secret); CloudNativePG confines its own.
	Pods kube.Config
	// OperatorNamespace is CloudNativePG's namespace, whose pods the network
	// policy of a Postgres database lets in.
	OperatorNamespace string
	// FieldManager is the server-side apply field manager. Default the kube
	// runtime's, "bex-deployer".
	FieldManager string
}

// DefaultConfig returns the defaults: CloudNativePG's image of PostgreSQL 15
// (the version the local runtime offers) and the official Redis image.
func DefaultConfig() Config {
	return Config{
		Postgres:          databases.Image{Ref: "ghcr.io/cloudnative-pg/postgresql:15", Version: "15"},
		PostgresUID:       DefaultPostgresUID,
		PostgresGID:       DefaultPostgresUID,
		Redis:             databases.DefaultConfig().Redis,
		Pods:              kube.DefaultConfig(),
		OperatorNamespace: DefaultOperatorNamespace,
		FieldManager:      kube.DefaultFieldManager,
	}
}

// Validate reports what is missing or out of range.
func (c Config) Validate() error {
	var errs []error
	if c.Postgres.Ref == "" || c.Redis.Ref == "" {
		errs = append(errs, errors.New("databases: both images must be set"))
	}
	if c.PostgresUID < 1 || c.PostgresGID < 1 {
		errs = append(errs, fmt.Errorf("databases: postgres uid %d, gid %d: CloudNativePG runs Postgres as a user other than root", c.PostgresUID, c.PostgresGID))
	}
	for _, msg := range validation.IsDNS1123Label(c.OperatorNamespace) {
		errs = append(errs, fmt.Errorf("databases: operator namespace %q: %s", c.OperatorNamespace, msg))
	}
	if c.FieldManager == "" {
		errs = append(errs, errors.New("databases: FieldManager is empty"))
	}
	if err := c.Pods.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
