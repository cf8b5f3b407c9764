// Package databases reconciles Databases (app.bex.co/v1alpha1) on one machine:
// each runs as an instance of the local runtime, under the runtime key
// "<name>.db" (appv1.RuntimeName), confined as an app's instances are (user
// and network namespaces, limits, restarts, logs), its data on a volume of its
// own of spec.size.
//
// What it owns for each Database:
//
//   - the credentials Secret appv1.CredentialsSecret(name), labelled
//     app.bex.co/database, owned by the Database: a password made once, the
//     URL, host, port, user and database. Apps link with a config var that
//     takes "url" from it; the runtime gives their instances (and one-offs)
//     the reach of the port the Secret names, and nothing else;
//   - a stable address: the apps' gateway on a port of its own
//     (Config.PortMin..PortMax, kept in status.port), which the Network leads
//     to wherever the server's instance is (a new address after each restart
//     of bex up);
//   - status: phase, the Ready condition, host, port, version, image, the
//     linked apps.
//
// A server's instance is replaced by a config change (memory, version) as an
// app's instance is, new one first: the command takes a lock on the volume
// (flock) before the server starts, so the new server waits until the old one
// has stopped, and two servers never open the same data.
//
// Deleting a Database stops its server, removes its volume (the data), its
// address and its Secret. The commands refuse to destroy a linked database; a
// Database deleted with kubectl while linked goes all the same, and the linked
// apps' instances fail to start again until they are unlinked.
package databases
