package recoverer

// WithStore returns cfg with its Redis reached through s: a test's wrapper
// around the store, to inject faults.
func WithStore(cfg Config, s store) Config {
	cfg.store = s
	return cfg
}
