// Package cluster reconciles Databases (app.bex.co/v1alpha1) on a Kubernetes
// cluster, beside the kube runtime's apps (bex deployer --runtime kubernetes):
// Postgres through CloudNativePG, Redis as a StatefulSet. Package databases
// does the same on one machine; the two share the credentials Secret's content
// (databases.FillCredentials), the links, the version check and Redis's
// command line, so that an app links to a database with the same config var
// on both.
//
// What it owns for each Database, in its namespace, every object controlled by
// the Database (an owner reference), so that the garbage collector removes
// them all when the Database goes:
//
//   - the credentials Secret appv1.CredentialsSecret(name) ("bex-db-<name>"),
//     created once with a password and never read back (the deployer may
//     create Secrets, not read them): url, host, port, password and, for
//     Postgres, user, database and username, of type kubernetes.io/basic-auth
//     as CloudNativePG's initdb wants it. Apps link with a config var that
//     takes "url" from it, which the kube runtime makes a secretKeyRef;
//   - Postgres: a CloudNativePG Cluster named after the Database
//     (postgresql.cnpg.io/v1, written unstructured: bex does not import
//     CloudNativePG's module): spec.instances instances (1 to 3: the others
//     are replicas that take over when the primary dies), the operand image
//     and its postgres uid/gid from Config, spec.size of disk, spec.resources,
//     and initdb's database and owner appv1.PostgresName(name) with the
//     Secret's password. The apps reach it at the Cluster's read-write Service
//     "<name>-rw.<namespace>.svc", port 5432, which follows the primary. The
//     Cluster owns what the operator makes (pods, claims, Services, its own
//     Secrets), so those go with it;
//   - Redis: a StatefulSet "<name>-redis" of one pod, confined as an app's
//     (kube.PodSpec, kube.ContainerSecurityContext: its own user namespace, no
//     API token, capabilities dropped, seccomp), running the image's
//     docker-entrypoint.sh with databases.RedisServer (the password from the
//     Secret, append-only), on a claim of spec.size that the StatefulSet
//     deletes with itself (persistentVolumeClaimRetentionPolicy); and a
//     Service "<name>-redis", port 6379. Redis runs one instance: more is
//     refused (Failed, TooManyInstances). Its disk is fixed when it is made (a
//     StatefulSet's claim templates cannot change), as on one machine;
//   - a NetworkPolicy "bex-db-<name>" on the servers' pods, letting in only
//     the pods of the linked apps (app.bex.co/app in status.links: their
//     instances, one-offs and cron jobs), the database's own one-offs
//     (app.bex.co/app=<name>.db: the gitserver's psql, pg_dump, redis-cli), and
//     for Postgres the Cluster's own pods (replication) and CloudNativePG's
//     namespace (the operator). Whether it holds depends on the cluster's
//     network plugin enforcing NetworkPolicies.
//
// Status: Creating until a server is ready (a ready instance of the Cluster;
// a ready pod of the StatefulSet), then Running with the Ready condition;
// Failed with a reason when a pod of its servers cannot run (ImageNotFound,
// CrashLoop, CreateContainerConfigError), when CloudNativePG reports a phase
// it does not leave by itself (ClusterFailed), when the API server refuses an
// object (Refused), or for what it asks (VersionUnavailable,
// TooManyInstances; NoOperator where CloudNativePG's Cluster kind is not
// served). Host, port, image and version (the Cluster's major version once it
// reports one), and the linked apps (a watch on Apps). No polling: the
// reconciler watches the Clusters and StatefulSets it owns and the pods of
// the servers. usedBytes is not measured.
package cluster
