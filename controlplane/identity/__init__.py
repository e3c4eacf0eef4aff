"""Sign-in through an OpenID Connect provider, beside bearer tokens (docs/sign-in.md).

`config` reads the operator's settings, `mapping` turns the provider's groups into a tenant or
the admin role (pure), `provider` speaks to the provider (discovery, JWKS, tokens) and verifies
what it signs, and `sessions` keeps the sessions a sign-in opens and ends them when the provider
stops vouching for the person."""
