package regional

// newTestSyncer builds a syncer over reg with the given global config and
// region name; d carries any further collaborators (Registry is reg).
func newTestSyncer(global GlobalConfig, region string, reg *Registry, d syncDeps) *syncer {
	cfg := syncConfigOf(reg.cfg)
	cfg.Global, cfg.Region, cfg.MTLS = global, region, false
	d.Registry = reg
	return newSyncer(cfg, d)
}
