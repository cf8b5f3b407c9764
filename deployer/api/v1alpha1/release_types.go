package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Release is one numbered, immutable version of an App: an image plus the config it
// ran with, and what caused it. A rollback is a new Release that points at an older
// image and config, as on Heroku, so the history only grows. Releases are owned by
// their App and named "<app>-v<number>".
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=rel
// +kubebuilder:printcolumn:name="App",type="string",JSONPath=".spec.app"
// +kubebuilder:printcolumn:name="Number",type="integer",JSONPath=".spec.number"
// +kubebuilder:printcolumn:name="Cause",type="string",JSONPath=".spec.cause"
// +kubebuilder:printcolumn:name="Commit",type="string",JSONPath=".spec.commit",priority=1
// +kubebuilder:printcolumn:name="Actor",type="string",JSONPath=".spec.actor"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type Release struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the release is. It cannot change once created.
	// +required
	Spec ReleaseSpec `json:"spec"`
}

// ReleaseCause says what made a release.
// +kubebuilder:validation:Enum=Push;Config;Rollback;Webhook;Scale;Deploy;Image
type ReleaseCause string

// The causes of a Release.
const (
	// ReleaseCausePush: a git push to the deploy branch was built.
	ReleaseCausePush ReleaseCause = "Push"
	// ReleaseCauseConfig: config vars changed.
	ReleaseCauseConfig ReleaseCause = "Config"
	// ReleaseCauseRollback: an older release's image and config were brought back.
	ReleaseCauseRollback ReleaseCause = "Rollback"
	// ReleaseCauseWebhook: a signed webhook asked for a rebuild.
	ReleaseCauseWebhook ReleaseCause = "Webhook"
	// ReleaseCauseScale: process types or their commands changed.
	ReleaseCauseScale ReleaseCause = "Scale"
	// ReleaseCauseDeploy: an image was deployed directly through the API.
	ReleaseCauseDeploy ReleaseCause = "Deploy"
	// ReleaseCauseImage: an image from a registry was deployed as it is
	// (deploy:image): no build, no Procfile, no release phase.
	ReleaseCauseImage ReleaseCause = "Image"
)

// ReleaseSpec is the content of a Release.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a Release is immutable: create a new Release instead (rollback creates one that points at an older image)"
type ReleaseSpec struct {
	// app is the name of the App this release belongs to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	App string `json:"app"`

	// number counts the app's releases from 1.
	// +kubebuilder:validation:Minimum=1
	Number int64 `json:"number"`

	// image is the digest-pinned image the release runs.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[^@\s]+@sha256:[a-f0-9]{64}$`
	Image string `json:"image"`

	// commit is the git commit the image was built from, when it was built from git.
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{40}|[0-9a-f]{64})$`
	Commit string `json:"commit,omitempty"`

	// config is the snapshot of config vars and process types the release runs with.
	// Values taken from Secrets stay references.
	// +optional
	Config ReleaseConfig `json:"config,omitempty"`

	// cause is what made the release.
	Cause ReleaseCause `json:"cause"`

	// actor is who or what caused it: a user name, "webhook:github", an agent's name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Actor string `json:"actor,omitempty"`

	// description is one line for people ("Rollback to v3", "Set GREETING").
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Description string `json:"description,omitempty"`

	// rollbackOf is the number of the release brought back, for cause Rollback.
	// +optional
	// +kubebuilder:validation:Minimum=1
	RollbackOf int64 `json:"rollbackOf,omitempty"`

	// delivery is the id of the webhook delivery that caused the release, for cause
	// Webhook: the one the git host shows in its delivery log.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Delivery string `json:"delivery,omitempty"`
}

// ReleaseConfig is the config part of a release.
type ReleaseConfig struct {
	// env are the config vars.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=500
	Env []EnvVar `json:"env,omitempty"`

	// processes are the process types and their scale.
	// +optional
	// +kubebuilder:validation:MaxProperties=20
	Processes map[string]ProcessSpec `json:"processes,omitempty"`

	// scripts are the release's release and postdeploy commands.
	// +optional
	Scripts *Scripts `json:"scripts,omitempty"`

	// cron are the release's cron jobs.
	// +optional
	Cron []CronJob `json:"cron,omitempty"`
}

// ReleaseList is a list of Releases.
//
// +kubebuilder:object:root=true
type ReleaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Release `json:"items"`
}
