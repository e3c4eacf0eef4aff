-- The connecting user (who runs migrations) must be able to act as the application's role:
-- superusers always can, an owner that is not a superuser only as a member.
GRANT trainyard_app TO CURRENT_USER;
