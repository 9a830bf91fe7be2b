//! The backup store: series, recipes, RevDedup reverse deduplication. (in progress)
