package events

// This file re-exports every exported name of contract and streamclient
// (TestFacadeIsComplete): types as aliases, constants as constants, and
// functions and variables (the sentinel errors among them) as variables
// holding the same values, so errors.Is matches either name.

import (
	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/streamclient"
)

// Types of the event contract (package contract).
type (
	AggregationReclaimed = contract.AggregationReclaimed
	CalendarSchedule     = contract.CalendarSchedule
	Catchup              = contract.Catchup
	CatchupPolicy        = contract.CatchupPolicy
	Duration             = contract.Duration
	Entry                = contract.Entry
	Event                = contract.Event
	EventIDFields        = contract.EventIDFields
	EventKind            = contract.EventKind
	Exclusions           = contract.Exclusions
	FailPauseRequest     = contract.FailPauseRequest
	FieldError           = contract.FieldError
	Fired                = contract.Fired
	Names                = contract.Names
	Options              = contract.Options
	OverlapPolicy        = contract.OverlapPolicy
	Selector             = contract.Selector
	Shard                = contract.Shard
	Skipped              = contract.Skipped
	Task                 = contract.Task
	TaskCancelled        = contract.TaskCancelled
	TaskIDFields         = contract.TaskIDFields
	TaskRecovered        = contract.TaskRecovered
	TasksLost            = contract.TasksLost
	TypeInfo             = contract.TypeInfo
)

// Constants of the event contract (package contract).
const (
	CancelDeleted            = contract.CancelDeleted
	CancelRequested          = contract.CancelRequested
	CatchupAll               = contract.CatchupAll
	CatchupLatest            = contract.CatchupLatest
	CatchupNone              = contract.CatchupNone
	DefaultCatchupWindow     = contract.DefaultCatchupWindow
	DefaultMaxRetry          = contract.DefaultMaxRetry
	DefaultPrefix            = contract.DefaultPrefix
	DefaultQueue             = contract.DefaultQueue
	DefaultTimeout           = contract.DefaultTimeout
	DefaultTimezone          = contract.DefaultTimezone
	EventIDCancelled         = contract.EventIDCancelled
	EventIDFired             = contract.EventIDFired
	EventIDLost              = contract.EventIDLost
	EventIDReclaimed         = contract.EventIDReclaimed
	EventIDRecovered         = contract.EventIDRecovered
	EventIDSkipped           = contract.EventIDSkipped
	EventIDTriggered         = contract.EventIDTriggered
	FailPauseNotePrefix      = contract.FailPauseNotePrefix
	GatedSuffix              = contract.GatedSuffix
	HeaderBackfill           = contract.HeaderBackfill
	HeaderEntry              = contract.HeaderEntry
	HeaderRedisUnconfirmed   = contract.HeaderRedisUnconfirmed
	HeaderScheduledAt        = contract.HeaderScheduledAt
	HeaderTrigger            = contract.HeaderTrigger
	MaxPayloadBytes          = contract.MaxPayloadBytes
	OverlapAllow             = contract.OverlapAllow
	OverlapBufferOne         = contract.OverlapBufferOne
	OverlapCancelPrevious    = contract.OverlapCancelPrevious
	OverlapSkip              = contract.OverlapSkip
	ReservedHeaderPrefix     = contract.ReservedHeaderPrefix
	ShardsPerQueue           = contract.ShardsPerQueue
	SkipExcluded             = contract.SkipExcluded
	SkipMissed               = contract.SkipMissed
	SkipOverlap              = contract.SkipOverlap
	SkipOverlapDropped       = contract.SkipOverlapDropped
	SkipPaused               = contract.SkipPaused
	SkipRemoved              = contract.SkipRemoved
	SkipUnique               = contract.SkipUnique
	SpecVersion              = contract.SpecVersion
	TaskTickLayout           = contract.TaskTickLayout
	TypeAggregationReclaimed = contract.TypeAggregationReclaimed
	TypeEntryFired           = contract.TypeEntryFired
	TypeEntryPaused          = contract.TypeEntryPaused
	TypeEntryRegistered      = contract.TypeEntryRegistered
	TypeEntryRemoved         = contract.TypeEntryRemoved
	TypeEntryResumed         = contract.TypeEntryResumed
	TypeEntrySkipped         = contract.TypeEntrySkipped
	TypeEntryUpdated         = contract.TypeEntryUpdated
	TypeTaskArchived         = contract.TypeTaskArchived
	TypeTaskCancelled        = contract.TypeTaskCancelled
	TypeTaskLost             = contract.TypeTaskLost
	TypeTaskRetried          = contract.TypeTaskRetried
)

// Sentinel errors and tables of the event contract (package contract).
var (
	ConfigTypes               = contract.ConfigTypes
	ErrBadSelector            = contract.ErrBadSelector
	ErrCatchupBeyondRetention = contract.ErrCatchupBeyondRetention
	ErrFailPauseRefused       = contract.ErrFailPauseRefused
	ErrInvalidEntry           = contract.ErrInvalidEntry
	ErrMalformedEvent         = contract.ErrMalformedEvent
	ErrNotArmed               = contract.ErrNotArmed
	Types                     = contract.Types
)

// Functions of the event contract (package contract).
var (
	BatchID                = contract.BatchID
	BucketOfStream         = contract.BucketOfStream
	BucketStream           = contract.BucketStream
	BucketSubject          = contract.BucketSubject
	CancelledEventID       = contract.CancelledEventID
	CatchupBeyondRetention = contract.CatchupBeyondRetention
	CheckSource            = contract.CheckSource
	ConfigKind             = contract.ConfigKind
	ConfigMessageID        = contract.ConfigMessageID
	DecodeConfigEvent      = contract.DecodeConfigEvent
	DecodeConfigEventInto  = contract.DecodeConfigEventInto
	DecodeEvent            = contract.DecodeEvent
	DecodeEvents           = contract.DecodeEvents
	DecodeFailPause        = contract.DecodeFailPause
	DecodeQueueToken       = contract.DecodeQueueToken
	DisplayType            = contract.DisplayType
	EncodeQueueToken       = contract.EncodeQueueToken
	FiredEventID           = contract.FiredEventID
	FormatTaskTick         = contract.FormatTaskTick
	GatedType              = contract.GatedType
	IsBatch                = contract.IsBatch
	IsConfigType           = contract.IsConfigType
	IsGatedType            = contract.IsGatedType
	IsServerWritten        = contract.IsServerWritten
	LostEventID            = contract.LostEventID
	MaxFiresSince          = contract.MaxFiresSince
	Mix64                  = contract.Mix64
	MustNames              = contract.MustNames
	NewEvent               = contract.NewEvent
	NewEventAt             = contract.NewEventAt
	NewEventID             = contract.NewEventID
	NewNames               = contract.NewNames
	ParseCron              = contract.ParseCron
	ParseDuration          = contract.ParseDuration
	ParseEventID           = contract.ParseEventID
	ParseLabel             = contract.ParseLabel
	ParseSelector          = contract.ParseSelector
	ParseTaskID            = contract.ParseTaskID
	QueueShards            = contract.QueueShards
	ReclaimedEventID       = contract.ReclaimedEventID
	RecoveredEventID       = contract.RecoveredEventID
	ReplicaSource          = contract.ReplicaSource
	SameContent            = contract.SameContent
	ServerWrittenReason    = contract.ServerWrittenReason
	ShardOf                = contract.ShardOf
	DutyShard              = contract.DutyShard
	GlobalShard            = contract.GlobalShard
	ShardOfEntry           = contract.ShardOfEntry
	ShortType              = contract.ShortType
	SkippedEventID         = contract.SkippedEventID
	SkippedRangeEventID    = contract.SkippedRangeEventID
	SplitEvents            = contract.SplitEvents
	TaskHeaders            = contract.TaskHeaders
	TaskID                 = contract.TaskID
	TaskIDOfTickText       = contract.TaskIDOfTickText
	TaskIDPrefix           = contract.TaskIDPrefix
	TriggerFiredEventID    = contract.TriggerFiredEventID
	TriggerSkippedEventID  = contract.TriggerSkippedEventID
	TriggerTaskID          = contract.TriggerTaskID
	ValidateID             = contract.ValidateID
	ValidateLabelKey       = contract.ValidateLabelKey
	ValidateLabelValue     = contract.ValidateLabelValue
	ValidateLabels         = contract.ValidateLabels
	ValidateListedID       = contract.ValidateListedID
	ValidateReplicaID      = contract.ValidateReplicaID
	ZonePeriodEnd          = contract.ZonePeriodEnd
)

// Types of the NATS client (package streamclient).
type (
	Client              = streamclient.Client
	ClientOption        = streamclient.ClientOption
	ConflictError       = streamclient.ConflictError
	Current             = streamclient.Current
	Record              = streamclient.Record
	Removal             = streamclient.Removal
	Result              = streamclient.Result
	StreamChange        = streamclient.StreamChange
	StreamConfig        = streamclient.StreamConfig
	StreamConflictError = streamclient.StreamConflictError
	StreamMode          = streamclient.StreamMode
	WriteOption         = streamclient.WriteOption
)

// Constants of the NATS client (package streamclient).
const (
	Apply                  = streamclient.Apply
	CreateMissing          = streamclient.CreateMissing
	DefaultActivityMaxAge  = streamclient.DefaultActivityMaxAge
	DefaultDuplicateWindow = streamclient.DefaultDuplicateWindow
	DefaultSource          = streamclient.DefaultSource
	DryRun                 = streamclient.DryRun
	MinDuplicateWindow     = streamclient.MinDuplicateWindow
)

// Sentinel errors of the NATS client (package streamclient).
var (
	ErrNotFound           = streamclient.ErrNotFound
	ErrRevisionConflict   = streamclient.ErrRevisionConflict
	ErrStreamConflict     = streamclient.ErrStreamConflict
	ErrSubjectNotCaptured = streamclient.ErrSubjectNotCaptured
)

// Functions of the NATS client (package streamclient).
var (
	ActivityMaxAge    = streamclient.ActivityMaxAge
	EnsureStreams     = streamclient.EnsureStreams
	IfRevision        = streamclient.IfRevision
	NewClient         = streamclient.NewClient
	RepublishInto     = streamclient.RepublishInto
	StreamWriteRoutes = streamclient.StreamWriteRoutes
	SyncStreams       = streamclient.SyncStreams
	WithClock         = streamclient.WithClock
	WithRetryBudget   = streamclient.WithRetryBudget
	WithSource        = streamclient.WithSource
	WriteRoute        = streamclient.WriteRoute
)
